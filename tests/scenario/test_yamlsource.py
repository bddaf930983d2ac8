from __future__ import annotations

import pickle
from typing import Annotated, Literal, Union

import pydantic
import pytest

from chaos.yamlsource import (
    ConfigError,
    Locator,
    format_path,
    format_validation_error,
    load_model,
    load_yaml,
    load_yaml_text,
)


def test_locator_lines_for_keys_and_items():
    data, loc = load_yaml_text("a: 1\nb:\n  - x: 1\n    y: 2\n  - {x: 3}\n")
    assert data == {"a": 1, "b": [{"x": 1, "y": 2}, {"x": 3}]}
    assert loc.line_of(("a",)) == 1
    assert loc.line_of(("b", 0)) == 3
    assert loc.line_of(("b", 0, "y")) == 4
    assert loc.line_of(("b", 1, "x")) == 5
    # unknown deeper paths fall back to the nearest ancestor
    assert loc.line_of(("b", 1, "x", "nope", 3)) == 5
    assert loc.line_of(("zzz",)) == 1  # the root
    assert Locator().line_of(("a",)) is None


def test_merge_keys_point_at_the_anchor():
    data, loc = load_yaml_text("base: &b {x: 1, z: 0}\nc:\n  <<: *b\n  y: 2\n  z: 3\n")
    assert data["c"] == {"x": 1, "y": 2, "z": 3}
    assert loc.line_of(("c", "x")) == 1
    assert loc.line_of(("c", "y")) == 4
    assert loc.line_of(("c", "z")) == 5  # an own key overrides a merged one: not a duplicate


def test_merge_of_several_anchors_first_wins():
    data, loc = load_yaml_text("a: &a {x: 1}\nb: &b {x: 2, y: 2}\nc:\n  <<: [*a, *b]\n")
    assert data["c"] == {"x": 1, "y": 2}
    assert loc.line_of(("c", "x")) == 1 and loc.line_of(("c", "y")) == 2


@pytest.mark.parametrize(
    "text, line, column, words",
    [
        ("a: [1,\nb: 2", 2, 5, "flow sequence"),
        ("a: b: c", 1, 5, "mapping values are not allowed"),
        ("x: 1\n---\ny: 2\n", 2, 1, "single document"),
        ("a: 2024-02-30", 1, 4, "invalid date"),
    ],
)
def test_yaml_syntax_errors_have_line_and_column(text, line, column, words):
    with pytest.raises(ConfigError) as ei:
        load_yaml_text(text, display="f.yaml")
    e = ei.value
    assert (e.file, e.line, e.column) == ("f.yaml", line, column)
    assert words in e.message
    assert str(e).startswith(f"f.yaml:{line}:{column}: ")


def test_duplicate_key_is_an_error():
    with pytest.raises(ConfigError) as ei:
        load_yaml_text("a: 1\nb:\n  c: 1\n  c: 2\n", display="f.yaml")
    assert ei.value.line == 4 and ei.value.field == "b.c"
    assert "duplicate key 'c' (first at line 3)" in str(ei.value)


def test_unreadable_files(tmp_path):
    with pytest.raises(ConfigError, match="file not found"):
        load_yaml(tmp_path / "missing.yaml")
    with pytest.raises(ConfigError, match="directory"):
        load_yaml(tmp_path)
    bad = tmp_path / "bad.yaml"
    bad.write_bytes(b"a: 1\nb: \xff\n")
    with pytest.raises(ConfigError, match="not UTF-8") as ei:
        load_yaml(bad)
    assert ei.value.line == 2


def test_control_character_is_a_config_error():
    with pytest.raises(ConfigError, match="unacceptable character"):
        load_yaml_text("a: \x07")


@pytest.mark.parametrize("text, line", [
    ("- &a [*a]\n", 1),
    ("a: &x\n  b:\n    c: *x\n", 3),
    # The input that showed it: compose/reference.yml without its `services:` line puts every
    # service under the anchored x-telemetry-off mapping, whose aliases then point into it.
    ("x-env: &env\n  A: '1'\n  svc:\n    environment: *env\n", 4),
])
def test_a_cyclic_alias_is_an_error_at_the_alias(text, line):
    with pytest.raises(ConfigError, match=r"refers to the node that contains it \(a cycle\)") as ei:
        load_yaml_text(text, display="f.yaml")
    assert ei.value.line == line


def test_empty_document():
    assert load_yaml_text("") == (None, Locator())


def test_format_path():
    assert format_path(["phases", 1, "faults", 0, "duration"]) == "phases[1].faults[0].duration"
    assert format_path(["links", "engine-lmcache", "listen"]) == "links.engine-lmcache.listen"
    assert format_path(["a", "x.y"]) == 'a["x.y"]'
    assert format_path([]) == ""


class _L(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid")
    kind: Literal["l"]
    x: int


class _M(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid")
    kind: Literal["m"]
    y: float | str


class _Root(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid")
    items: list[Annotated[Union[_L, _M], pydantic.Field(discriminator="kind")]]


def test_validation_errors_point_at_lines_without_union_tags():
    text = (
        "items:\n"
        "  - kind: l\n"
        "    x: abc\n"
        "  - kind: m\n"
        "    y: [1]\n"
        "    q: 3\n"
        "  - kind: zz\n"
        "  - {kind: l}\n"
        "  - {x: 1}\n"
    )
    data, loc = load_yaml_text(text)
    with pytest.raises(pydantic.ValidationError) as ei:
        _Root.model_validate(data)
    lines = format_validation_error("f.yaml", ei.value, loc, data).splitlines()
    assert lines[0].startswith("f.yaml:3: items[0].x: Input should be a valid integer")
    assert lines[0].endswith("(got abc)")
    assert lines[1].startswith("f.yaml:5: items[1].y: ")  # both union members, one line
    assert lines[2] == "f.yaml:6: items[1].q: unknown key (not allowed here; check the spelling)"
    assert lines[3] == "f.yaml:7: items[2]: unknown kind 'zz'; expected one of: 'l', 'm'"
    assert lines[4] == "f.yaml:8: items[3].x: required key is missing"
    assert lines[5] == "f.yaml:9: items[4]: required key 'kind' is missing"
    assert len(lines) == 6


def test_load_model_raises_config_error_with_every_problem(tmp_path):
    p = tmp_path / "r.yaml"
    p.write_text("items:\n  - {kind: l, x: 1}\n  - {kind: l, x: abc}\n  - {kind: m}\n")
    with pytest.raises(ConfigError) as ei:
        load_model(p, _Root)
    e = ei.value
    assert (e.line, e.field) == (3, "items[1].x")
    assert len(e.problems) == 2 and e.problems[1].startswith(f"{p}:4: items[2].y: ")
    again = pickle.loads(pickle.dumps(e))
    assert str(again) == str(e) and again.line == 3
    p.write_text("items:\n  - {kind: l, x: 1}\n")
    obj, loc = load_model(p, _Root)
    assert obj.items[0].x == 1 and loc.line_of(("items", 0)) == 2
