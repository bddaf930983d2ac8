"""The scenario loader raises ConfigError for any bad input, never another exception."""

from __future__ import annotations

import copy
from pathlib import Path

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from chaos.scenario.loader import load_scenario
from chaos.scenario.model import Scenario
from chaos.yamlsource import ConfigError

from .samples import GOOD, STACK

FUZZ = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
    st.sampled_from(["-3s", "1m30s", "500ms", "end", "0", "latency", "engine-lmcache", "1e999", "2024-02-30"]),
)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=10,
)

BASE = yaml.safe_load(GOOD)


def _paths(node, prefix=()):
    yield prefix
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _paths(v, prefix + (k,))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _paths(v, prefix + (i,))


PATHS = [p for p in _paths(BASE) if p]
FIELD_NAMES = ["kind", "link", "start", "duration", "until", "name", "stream", "toxicity", "latency_ms",
               "requests", "faults", "phases", "checks", "workload", "tenants", "stream", "bogus"]


def _check(path: Path, text_lines: int) -> None:
    try:
        s = load_scenario(path)
    except ConfigError as e:
        assert e.file == str(path)
        assert e.problems and all(p.startswith(str(path)) for p in e.problems)
        if e.line is not None:
            assert 1 <= e.line <= text_lines + 1
    else:
        assert isinstance(s, Scenario)


def _write(tmp_path: Path, text: str) -> Path:
    (tmp_path / "stack.yml").write_text(STACK)
    p = tmp_path / "fuzz.yaml"
    p.write_text(text, encoding="utf-8", errors="surrogatepass")
    return p


@FUZZ
@given(path=st.sampled_from(PATHS), value=values, extra=st.sampled_from(FIELD_NAMES), add=st.booleans())
def test_mutated_fields(tmp_path, path, value, extra, add):
    data = copy.deepcopy(BASE)
    parent = data
    for step in path[:-1]:
        parent = parent[step]
    if add and isinstance(parent, dict):
        parent[extra] = value
    else:
        parent[path[-1]] = value
    text = yaml.safe_dump(data, allow_unicode=True)
    _check(_write(tmp_path, text), text.count("\n") + 1)


@FUZZ
@given(pos=st.integers(min_value=0, max_value=len(GOOD)), junk=st.text(max_size=8), cut=st.integers(0, 5))
def test_mutated_text(tmp_path, pos, junk, cut):
    text = GOOD[:pos] + junk + GOOD[pos + cut:]
    if any(0xD800 <= ord(c) <= 0xDFFF for c in text):
        text = text.encode("utf-8", "replace").decode()
    _check(_write(tmp_path, text), text.count("\n") + 1)


@FUZZ
@given(text=st.text(max_size=200))
def test_arbitrary_text(tmp_path, text):
    text = text.encode("utf-8", "replace").decode("utf-8", "replace")
    _check(_write(tmp_path, text), text.count("\n") + 1)
