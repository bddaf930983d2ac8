"""YAML files that remember where each value came from, and errors that say file:line.

Every user-written file kvchaos reads (scenarios, stack files) goes through here:

    text ──> SafeLoader (compose: nodes with marks) ──> plain data + Locator
                                                          │
    pydantic model.model_validate(data) ── ValidationError ┴─> ConfigError("file:12: a.b[1]: ...")

The module knows nothing about scenarios or stacks: it maps a *data path* (a tuple of mapping
keys and sequence indexes, e.g. ``("phases", 1, "faults", 0, "duration")``) to the 1-based line
of that key or item, and turns pydantic errors into lines a user can act on.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pydantic
import yaml

__all__ = [
    "ConfigError",
    "DataPath",
    "Locator",
    "format_path",
    "format_validation_error",
    "config_error_from_validation",
    "load_yaml",
    "load_yaml_text",
    "load_model",
]

DataPath = tuple[str | int, ...]
"""A path into loaded YAML data: mapping keys (usually str) and sequence indexes (int)."""

ModelT = TypeVar("ModelT", bound=pydantic.BaseModel)


class ConfigError(Exception):
    """A user-written file is invalid. The CLI maps it to exit code 2.

    Attributes:
        file: the file as given by the user (str), or "<string>" for text.
        line: 1-based line, or None when unknown.
        column: 1-based column (YAML syntax errors only), or None.
        field: dotted data path (``phases[1].faults[0].duration``), or None.
        message: what is wrong, without the location prefix.
        problems: every problem found, each a formatted ``file:line: field: message`` line; the
            first one is the one the other attributes describe.
    """

    def __init__(
        self,
        file: str,
        line: int | None,
        field: str | None,
        message: str,
        *,
        column: int | None = None,
        problems: list[str] | None = None,
    ) -> None:
        self.file = str(file)
        self.line = line
        self.column = column
        self.field = field or None
        self.message = message
        first = _format_line(self.file, line, self.field, message, column)
        self.problems = list(problems) if problems else [first]
        super().__init__("\n".join(self.problems))

    def __reduce__(self):  # keep pickling (pytest-xdist, multiprocessing) working
        return (
            _rebuild_config_error,
            (self.file, self.line, self.field, self.message, self.column, self.problems),
        )


def _rebuild_config_error(file, line, field, message, column, problems) -> ConfigError:
    return ConfigError(file, line, field, message, column=column, problems=problems)


def _format_line(
    file: str, line: int | None, field: str | None, message: str, column: int | None = None
) -> str:
    where = file
    if line is not None:
        where += f":{line}"
        if column is not None:
            where += f":{column}"
    return f"{where}: {field}: {message}" if field else f"{where}: {message}"


@dataclass
class Locator:
    """Where each mapping key and sequence item of a loaded YAML document starts.

    ``marks`` maps a data path to a 1-based (line, column). The root is ``()``.
    """

    marks: dict[DataPath, tuple[int, int]] = field(default_factory=dict)

    def line_of(self, path: Sequence[str | int]) -> int | None:
        """1-based line of the key or item at ``path``, or of its nearest recorded ancestor.

        Returns None only when nothing on the path (not even the root) is known, e.g. for an
        empty document.
        """
        mark = self.mark_of(path)
        return mark[0] if mark else None

    def mark_of(self, path: Sequence[str | int]) -> tuple[int, int] | None:
        """1-based (line, column) like :meth:`line_of`."""
        p = tuple(path)
        while True:
            mark = self.marks.get(p)
            if mark is not None:
                return mark
            if not p:
                return None
            p = p[:-1]

    def has(self, path: Sequence[str | int]) -> bool:
        """True when exactly this path was seen in the document."""
        return tuple(path) in self.marks


class _MarkingLoader(yaml.SafeLoader):
    """SafeLoader that turns constructor failures into MarkedYAMLErrors.

    Stock SafeLoader raises a bare ValueError for a timestamp-shaped scalar that is not a real
    date (``2024-02-30``); here it becomes a YAML error with the scalar's position.
    """

    def construct_yaml_timestamp(self, node):  # noqa: D401 - yaml constructor hook
        try:
            return super().construct_yaml_timestamp(node)
        except (ValueError, OverflowError) as exc:
            raise yaml.constructor.ConstructorError(
                None, None, f"invalid date/time {node.value!r}: {exc}", node.start_mark
            ) from None


_MarkingLoader.add_constructor("tag:yaml.org,2002:timestamp", _MarkingLoader.construct_yaml_timestamp)


def load_yaml(path: str | Path, *, display: str | None = None) -> tuple[Any, Locator]:
    """Load one YAML document from ``path`` with the positions of its keys and items.

    Args:
        path: the file to read.
        display: how to name the file in errors (default: ``str(path)`` as given).

    Returns:
        (data, locator): plain Python data (dict/list/str/int/float/bool/None/date) and a
        :class:`Locator` for it. An empty file gives ``(None, Locator())``.

    Raises:
        ConfigError: the file cannot be read, is not UTF-8, is not valid YAML (line and column
            set), has more than one document, or has a duplicate key in a mapping.
    """
    name = display if display is not None else str(path)
    try:
        raw = Path(path).read_bytes()
    except FileNotFoundError:
        raise ConfigError(name, None, None, "file not found") from None
    except IsADirectoryError:
        raise ConfigError(name, None, None, "is a directory, expected a YAML file") from None
    except OSError as exc:
        raise ConfigError(name, None, None, f"cannot read: {exc.strerror or exc}") from None
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise ConfigError(name, line, None, f"not UTF-8 text (byte {exc.start})") from None
    return load_yaml_text(text, display=name)


def load_yaml_text(text: str, *, display: str = "<string>") -> tuple[Any, Locator]:
    """Like :func:`load_yaml` for text already in memory; ``display`` names it in errors."""
    loader: _MarkingLoader | None = None
    try:
        loader = _MarkingLoader(text)
        node = loader.get_single_node()
        if node is None:
            return None, Locator()
        data = loader.construct_document(node)
        locator = Locator()
        _record(node, data, (), locator, display, set())
        return data, locator
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        msg = exc.problem or exc.context or "invalid YAML"
        if exc.problem and exc.context:
            where = ""
            if exc.context_mark is not None and exc.problem_mark is not None and (
                exc.context_mark.line != exc.problem_mark.line
            ):
                where = f" (line {exc.context_mark.line + 1})"
            msg = f"{exc.context}{where}: {exc.problem}"
        line, col = (mark.line + 1, mark.column + 1) if mark is not None else (None, None)
        raise ConfigError(display, line, None, f"YAML syntax: {msg}", column=col) from None
    except yaml.YAMLError as exc:  # ReaderError (control characters) and friends
        line = None
        text_before = text[: getattr(exc, "position", 0) or 0]
        if getattr(exc, "position", None) is not None:
            line = text_before.count("\n") + 1
        raise ConfigError(display, line, None, f"YAML: {_one_line(str(exc))}") from None
    except RecursionError:
        raise ConfigError(display, None, None, "YAML nested too deeply") from None
    finally:
        if loader is not None:
            loader.dispose()


def _one_line(s: str) -> str:
    return " ".join(s.split())


def _record(
    node: yaml.Node,
    data: Any,
    path: DataPath,
    locator: Locator,
    display: str,
    active: set[int],
) -> None:
    """Walk ``node`` and its constructed ``data`` side by side, recording marks per path."""
    if not path:
        locator.marks[()] = (node.start_mark.line + 1, node.start_mark.column + 1)
    if id(node) in active:  # recursive alias (&a [*a]): the data is cyclic; stop here
        return
    active.add(id(node))
    try:
        if isinstance(node, yaml.MappingNode) and isinstance(data, Mapping):
            # After merge keys (<<) are flattened, node.value lists the merged pairs first and
            # the mapping's own pairs after; the constructor lets the last pair of a key win.
            # Only two *own* pairs with one key are a duplicate; an own key may override a
            # merged one.
            start, end = node.start_mark.index, node.end_mark.index
            own_lines: dict[Any, int] = {}
            effective: dict[Any, tuple[yaml.Node, yaml.Node]] = {}
            for key_node, value_node in node.value:
                key = _key_of(key_node)
                if key is _NO_KEY or not _hashable(key):
                    continue
                if start <= key_node.start_mark.index < end:
                    if key in own_lines:
                        raise ConfigError(
                            display,
                            key_node.start_mark.line + 1,
                            format_path(path + (key,)) if isinstance(key, (str, int)) else None,
                            f"duplicate key {key!r} (first at line {own_lines[key]})",
                        )
                    own_lines[key] = key_node.start_mark.line + 1
                effective[key] = (key_node, value_node)
            for key, (key_node, value_node) in effective.items():
                child = path + (key,)
                locator.marks.setdefault(
                    child, (key_node.start_mark.line + 1, key_node.start_mark.column + 1)
                )
                if key in data:
                    _record(value_node, data[key], child, locator, display, active)
        elif isinstance(node, yaml.SequenceNode) and isinstance(data, list):
            for i, (item_node, item) in enumerate(zip(node.value, data)):
                child = path + (i,)
                locator.marks.setdefault(
                    child, (item_node.start_mark.line + 1, item_node.start_mark.column + 1)
                )
                _record(item_node, item, child, locator, display, active)
    finally:
        active.discard(id(node))


_NO_KEY = object()


def _key_of(key_node: yaml.Node) -> Any:
    if isinstance(key_node, yaml.ScalarNode):
        # Resolve the scalar the way the constructor did (``1`` -> 1, ``true`` -> True).
        loader = _MarkingLoader("")
        try:
            return loader.construct_object(key_node, deep=True)
        except yaml.YAMLError:
            return _NO_KEY
        finally:
            loader.dispose()
    return _NO_KEY


def _hashable(x: Any) -> bool:
    try:
        hash(x)
    except TypeError:
        return False
    return True


_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_\-]*$")


def format_path(path: Iterable[str | int]) -> str:
    """Render a data path the way users read it: ``phases[1].faults[0].duration``.

    Keys that are not plain names are quoted: ``links["a.b"]``.
    """
    out = ""
    for step in path:
        if isinstance(step, int) and not isinstance(step, bool):
            out += f"[{step}]"
        elif isinstance(step, str) and _IDENT.match(step):
            out += f".{step}" if out else step
        else:
            out += f"[{json.dumps(step) if isinstance(step, str) else repr(step)}]"
    return out


def _data_path(loc: Sequence[str | int], data: Any, error_type: str) -> DataPath:
    """Map a pydantic ``loc`` to a path in the user's data.

    Pydantic adds steps that are not in the data: the tag of a discriminated union
    (``faults.0.latency.duration``: the tag is the value of the discriminator key),
    ``function-after[...]`` wrappers, and the member type of a plain union (``start.float``).
    Walking the data alongside drops them. A missing key is kept as the last step.
    """
    out: list[str | int] = []
    cur = data
    steps = list(loc)
    for i, step in enumerate(steps):
        last = i == len(steps) - 1
        if isinstance(cur, Mapping):
            if not last and isinstance(step, str) and _is_tag(cur, step):
                continue  # the union tag, even when the user also wrote a key of that name
            if step in cur:
                out.append(step)
                cur = cur[step]
            elif last and error_type == "missing":
                out.append(step)
                cur = None
        elif isinstance(cur, list):
            if isinstance(step, int) and not isinstance(step, bool) and 0 <= step < len(cur):
                out.append(step)
                cur = cur[step]
        # a scalar: the remaining steps are union member names; drop them
    return tuple(out)


def _is_tag(mapping: Mapping, step: str) -> bool:
    """True when ``step`` is the value of some key of ``mapping`` (a discriminator's tag)."""
    try:
        return any(isinstance(v, str) and v == step for v in mapping.values())
    except TypeError:
        return False


def _short(value: Any, limit: int = 60) -> str:
    if isinstance(value, str):
        s = value
    else:
        try:
            s = json.dumps(value, default=str)
        except (TypeError, ValueError):
            s = repr(value)
    return s if len(s) <= limit else s[: limit - 3] + "..."


def _message(err: Mapping[str, Any]) -> str:
    typ = err.get("type", "")
    msg = str(err.get("msg", "invalid"))
    for prefix in ("Value error, ", "Assertion failed, "):
        if msg.startswith(prefix):
            msg = msg[len(prefix) :]
    if typ == "extra_forbidden":
        return "unknown key (not allowed here; check the spelling)"
    if typ == "missing":
        return "required key is missing"
    if typ in ("value_error", "assertion_error"):
        return msg
    inp = err.get("input", None)
    ctx = err.get("ctx") or {}
    if typ == "union_tag_invalid":
        return (
            f"unknown {str(ctx.get('discriminator', 'tag')).strip(chr(39))} "
            f"{ctx.get('tag')!r}; expected one of: {ctx.get('expected_tags')}"
        )
    if typ == "union_tag_not_found":
        return f"required key {str(ctx.get('discriminator', 'tag')).strip(chr(39))!r} is missing"
    if typ.startswith("union_tag") or typ in ("model_type", "dict_type", "list_type"):
        return msg + (f" (got {_short(inp)})" if not isinstance(inp, (dict, list)) else "")
    if isinstance(inp, (str, int, float, bool)) or inp is None:
        return f"{msg} (got {_short(inp)})"
    return msg


def config_error_from_validation(
    file: str | Path, exc: pydantic.ValidationError, locator: Locator, data: Any = None
) -> ConfigError:
    """Turn a pydantic ValidationError on YAML data into a ConfigError.

    Args:
        file: the file name to print.
        exc: the error from ``model_validate(data)``.
        locator: from :func:`load_yaml` for the same data.
        data: the data that was validated; used to drop pydantic's union/tag steps from the
            path. Without it the raw ``loc`` is shown.

    Returns:
        A ConfigError whose file/line/field/message describe the first problem and whose
        ``problems`` lists every problem, one ``file:line: field: message`` line each.
    """
    # Group by location: a plain union reports one error per member type at the same place.
    grouped: dict[tuple[int | None, str | None], list[str]] = {}
    for err in exc.errors(include_url=False):
        loc = err.get("loc", ())
        path = _data_path(loc, data, err.get("type", "")) if data is not None else tuple(loc)
        key = (locator.line_of(path), format_path(path) or None)
        msg = _message(err)
        if msg not in grouped.setdefault(key, []):
            grouped[key].append(msg)
    first: tuple[int | None, str | None, str] | None = None
    problems: list[str] = []
    for (line, fld), msgs in grouped.items():
        msg = "; or ".join(msgs)
        problems.append(_format_line(str(file), line, fld, msg))
        if first is None:
            first = (line, fld, msg)
    if first is None:
        first = (locator.line_of(()), None, str(exc))
        problems = [_format_line(str(file), first[0], None, first[2])]
    return ConfigError(str(file), first[0], first[1], first[2], problems=problems)


def format_validation_error(
    file: str | Path, exc: pydantic.ValidationError, locator: Locator, data: Any = None
) -> str:
    """One line per problem: ``scenarios/x.yaml:12: phases[1].faults[0].duration: must be
    positive (got -3s)``. Arguments as :func:`config_error_from_validation`."""
    return str(config_error_from_validation(file, exc, locator, data))


def load_model(
    path: str | Path,
    model: type[ModelT],
    *,
    context: dict[str, Any] | None = None,
    display: str | None = None,
) -> tuple[ModelT, Locator]:
    """Load ``path`` as YAML and validate it as ``model``.

    ``context`` is passed to pydantic validators (``info.context``); :func:`load_model` adds
    ``"source": Path(path)`` and ``"locator"`` to it so validators can resolve relative paths.

    Returns:
        (instance, locator).

    Raises:
        ConfigError: unreadable file, YAML error, or validation error (every problem listed).
    """
    name = display if display is not None else str(path)
    data, locator = load_yaml(path, display=name)
    ctx = {"source": Path(path), "locator": locator, **(context or {})}
    try:
        obj = model.model_validate(data, context=ctx)
    except pydantic.ValidationError as exc:
        raise config_error_from_validation(name, exc, locator, data) from None
    except RecursionError:
        raise ConfigError(name, None, None, "document nested too deeply (or cyclic aliases)") from None
    return obj, locator
