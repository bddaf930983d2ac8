"""YAML files that remember where each value came from, and errors that say file:line.

Every user-written file kvchaos reads (scenarios, stack files) goes through here:

    text ──> SafeLoader (compose: nodes with marks) ──> plain data + Locator
                                                          │
    pydantic model.model_validate(data) ── ValidationError ┴─> ConfigError("file:12: a.b[1]: ...")

The module knows nothing about scenarios or stacks: it maps a *data path* (a tuple of mapping
keys and sequence indexes, e.g. ``("phases", 1, "faults", 0, "duration")``) to the 1-based line
of that key or item, and turns pydantic errors into lines a user can act on.

Hostile input is bounded before anything walks the data (no input runs away): a file is read
only if it is a regular file of at most :data:`MAX_FILE_BYTES`; while the YAML is composed, the
nesting depth (:data:`MAX_DEPTH`), the number of aliases (:data:`MAX_ALIASES`) and the number
of values the document holds once every alias is expanded (:data:`MAX_VALUES`, which stops a
"billion laughs" file) are counted, and an alias to a node that contains it (a cycle) is an
error at the alias's line. Paths are checked by :func:`path_problem` without raising. Every
exception the YAML layer can raise on hostile input is a ConfigError: a value that its tag does
not accept (``!!bool maybe``, ``!!int zz``, ``!!timestamp foo``, ``!!null x``: bare KeyError,
ValueError, AttributeError or IndexError in PyYAML) at the value's line and column. Inside
:func:`foreign_file` (stack files) and with ``quote_values=False``, no error quotes the file.
"""

from __future__ import annotations

import contextvars
import errno
import json
import os
import re
import stat
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
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
    "validation_problems",
    "combine_problems",
    "load_yaml",
    "load_yaml_text",
    "load_model",
    "path_problem",
    "display_path",
    "kind_of",
    "foreign_file",
    "MAX_FILE_BYTES",
    "MAX_DEPTH",
    "MAX_ALIASES",
    "MAX_VALUES",
]

#: Largest scenario or stack file read (bytes); shipped files are under 10 KiB.
MAX_FILE_BYTES = 256 * 1024
#: Deepest nesting of mappings and sequences (shipped files nest at most 7 deep).
MAX_DEPTH = 64
#: Most aliases (``*name``) in one document.
MAX_ALIASES = 1000
#: Most values (scalars, mappings, sequences) a document may hold with every alias expanded.
MAX_VALUES = 50_000
#: Linux limits: a whole path (PATH_MAX) and one component (NAME_MAX), in bytes.
PATH_MAX_BYTES = 4096
NAME_MAX_BYTES = 255

# Set while a file named by a path inside another file is read (a scenario's ``stack:``): its
# YAML errors then say where, not what (no fragment of its text), since that path may name any
# file on the host (/etc/shadow).
_FOREIGN: contextvars.ContextVar[bool] = contextvars.ContextVar("kvchaos_yaml_foreign", default=False)


@contextmanager
def foreign_file() -> Iterator[None]:
    """Inside the block, errors of the YAML files read quote nothing of their text: YAML syntax
    errors keep their line, column and kind of problem but drop quoted fragments, and duplicate
    keys and bad dates are not echoed. For files named by a path in a user's file."""
    token = _FOREIGN.set(True)
    try:
        yield
    finally:
        _FOREIGN.reset(token)


def kind_of(data: Any) -> str:
    """What a loaded YAML document is, in words, for "expected a mapping, found ..." errors
    that must not quote the document (``"a text"``, ``"a list"``, ``"an empty document"``)."""
    if data is None:
        return "an empty document"
    if isinstance(data, bool):
        return "a boolean"
    if isinstance(data, (int, float)):
        return "a number"
    if isinstance(data, str):
        return "a text (one scalar)"
    if isinstance(data, list):
        return "a list"
    if isinstance(data, Mapping):
        return "a mapping"
    return f"a {type(data).__name__}"


def display_path(path: str | os.PathLike, limit: int = 160) -> str:
    """``path`` as printed in an error: at most ``limit`` characters (the middle elided) and
    control characters escaped, so a hostile name cannot flood or drive the terminal."""
    s = os.fsdecode(os.fspath(path)) if not isinstance(path, str) else path
    s = "".join(c if c.isprintable() else repr(c)[1:-1] for c in s)
    if len(s) > limit:
        s = s[: limit // 2 - 2] + "..." + s[-(limit // 2 - 1):]
    return s


def path_problem(path: str | os.PathLike, *, want: str = "file") -> str | None:
    """Why ``path`` cannot be read as a YAML file (or, ``want="dir"``, listed as a folder), or
    None when it can. Never raises.

    Checks, in order: a NUL byte, longer than PATH_MAX (4096 bytes), a component longer than
    NAME_MAX (255 bytes), then ``stat``: not found, a component that is not a folder, permission
    denied, a symlink loop, any other OS error; then the kind (a folder where a file is wanted,
    a device, FIFO or socket, a file where a folder is wanted) and, for files, size (over
    :data:`MAX_FILE_BYTES`).
    """
    try:
        raw = os.fsencode(os.fspath(path))
    except (TypeError, ValueError, UnicodeError) as exc:
        return f"not a usable path ({exc})"
    if b"\0" in raw:
        return "the path contains a NUL byte"
    if len(raw) > PATH_MAX_BYTES:
        return f"the path is longer than {PATH_MAX_BYTES} bytes ({len(raw)})"
    long = [c for c in raw.split(b"/") if len(c) > NAME_MAX_BYTES]
    if long:
        return f"a path component is longer than {NAME_MAX_BYTES} bytes ({len(long[0])})"
    try:
        st = os.stat(raw)
    except FileNotFoundError:
        return "file not found" if want == "file" else "no such file or folder"
    except NotADirectoryError:
        return "not found (a component of the path is a file, not a folder)"
    except PermissionError:
        return "permission denied"
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return "too many levels of symbolic links"
        return f"cannot read: {exc.strerror or exc}"
    except ValueError as exc:
        return f"not a usable path ({exc})"
    if want == "dir":
        return None if stat.S_ISDIR(st.st_mode) or stat.S_ISREG(st.st_mode) else \
            "not a file or folder (a device, FIFO or socket)"
    if stat.S_ISDIR(st.st_mode):
        return "is a directory, expected a YAML file"
    if not stat.S_ISREG(st.st_mode):
        return "not a regular file (a device, FIFO or socket), expected a YAML file"
    if st.st_size > MAX_FILE_BYTES:
        return f"file too large ({st.st_size} bytes; scenario and stack files are read up to {MAX_FILE_BYTES})"
    return None

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


class _Bounded(Exception):
    """A bound of the composer was crossed (turned into a ConfigError by load_yaml_text)."""

    def __init__(self, mark: yaml.Mark | None, message: str) -> None:
        super().__init__(message)
        self.mark = mark
        self.message = message


class _MarkingLoader(yaml.SafeLoader):
    """SafeLoader that bounds what it composes and turns constructor failures into
    MarkedYAMLErrors.

    While composing it counts the nesting depth, the aliases and the values the document holds
    with every alias expanded (each node's expanded size is memoised, so the count costs one
    pass over the distinct nodes); an alias to a node still being composed is a cycle. Stock
    SafeLoader raises bare Python exceptions for a value its tag does not accept (``!!bool
    maybe``: KeyError; ``!!int zz``, ``!!float 1e``, ``2024-02-30``: ValueError; ``!!timestamp
    foo``: AttributeError; ``!!float`` empty: IndexError); here each becomes a YAML error at the
    value's position saying what the tag expects, and ``!!null`` with a value is one too.
    """

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0
        self._aliases = 0
        self._values = 0
        self._sizes: dict[int, tuple[int, int]] = {}  # id(node) -> (expanded values, height)
        self._open_anchors: set[str] = set()

    def compose_node(self, parent, index):  # noqa: D401 - yaml composer hook
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            node = self.anchors.get(event.anchor)
            if node is not None:
                if event.anchor in self._open_anchors:
                    raise _Bounded(event.start_mark, f"alias *{event.anchor} refers to the node that "
                                   "contains it (a cycle); a document must be a tree")
                self._aliases += 1
                if self._aliases > MAX_ALIASES:
                    raise _Bounded(event.start_mark, f"more than {MAX_ALIASES} aliases in one document")
                size, height = self._sizes.get(id(node), (1, 1))
                self._values += size
                if self._values > MAX_VALUES:
                    raise _Bounded(event.start_mark, f"alias *{event.anchor} ({size} values) takes the "
                                   f"document past {MAX_VALUES} values with its aliases expanded "
                                   "(nested aliases that multiply: a 'billion laughs' file?)")
                if self._depth + height > MAX_DEPTH:
                    raise _Bounded(event.start_mark, f"alias *{event.anchor} nests the document deeper "
                                   f"than {MAX_DEPTH} levels")
            return super().compose_node(parent, index)
        event = self.peek_event()
        self._depth += 1
        if self._depth > MAX_DEPTH:
            raise _Bounded(event.start_mark, f"nested deeper than {MAX_DEPTH} levels")
        self._values += 1
        if self._values > MAX_VALUES:
            raise _Bounded(event.start_mark, f"more than {MAX_VALUES} values in one document")
        anchor = getattr(event, "anchor", None)
        collection = isinstance(event, (yaml.SequenceStartEvent, yaml.MappingStartEvent))
        if anchor and collection:
            self._open_anchors.add(anchor)
        try:
            node = super().compose_node(parent, index)
        finally:
            self._depth -= 1
            if anchor and collection:
                self._open_anchors.discard(anchor)
        if isinstance(node, yaml.SequenceNode):
            kids = [self._sizes.get(id(n), (1, 1)) for n in node.value]
        elif isinstance(node, yaml.MappingNode):
            kids = [self._sizes.get(id(n), (1, 1)) for kv in node.value for n in kv]
        else:
            kids = []
        self._sizes[id(node)] = (1 + sum(k[0] for k in kids), 1 + max((k[1] for k in kids), default=0))
        return node

    def construct_object(self, node, deep=False):  # noqa: D401 - yaml constructor hook
        """Stock constructors raise bare KeyError / ValueError / IndexError / AttributeError for
        a tagged value that does not construct (``!!bool maybe``, ``!!int zz``, ``!!float 1e``,
        ``!!timestamp foo``, an integer of more than 4300 digits): here every such failure is
        a ConstructorError at the value's position, saying what the tag expects."""
        try:
            return super().construct_object(node, deep=deep)
        except (yaml.YAMLError, RecursionError, MemoryError):
            raise
        except Exception as exc:  # noqa: BLE001 - any constructor failure is the file's fault
            raise yaml.constructor.ConstructorError(None, None, _bad_value_message(node, exc), node.start_mark) from None

    def construct_yaml_null(self, node):  # noqa: D401 - yaml constructor hook
        value = self.construct_scalar(node)
        if value not in _NULLS:  # `!!null x` would silently drop x
            raise ValueError("a value given to !!null")
        return None


_NULLS = ("", "~", "null", "Null", "NULL")
_TAGS = "tag:yaml.org,2002:"
#: What a standard tag's value must look like (YAML 1.1 types, https://yaml.org/type/).
_EXPECTED = {
    "bool": "expected true or false (also yes/no/on/off)",
    "int": "expected an integer (decimal, 0x hex, 0o or 0 octal, 0b binary, at most 4300 digits)",
    "float": "expected a number (1.5, 1e3, .inf, .nan)",
    "timestamp": "expected a date (YYYY-MM-DD) or a date and time (YYYY-MM-DDTHH:MM:SS, an offset up to 23:59)",
    "null": "expected no value (null, ~ or nothing)",
    "binary": "expected base64 text",
}


def _bad_value_message(node: yaml.Node, exc: BaseException) -> str:
    """What a YAML value that its tag's constructor refused should have been, for an error at
    its position: ``invalid !!bool value 'maybe': expected true or false ...``. The value is
    quoted (at most 60 characters) only outside :func:`foreign_file`."""
    tag = str(node.tag or "")
    short = tag[len(_TAGS):] if tag.startswith(_TAGS) else tag
    shown = f"!!{short}" if tag.startswith(_TAGS) else (tag or "untagged")
    what = ""
    if not _FOREIGN.get() and isinstance(node, yaml.ScalarNode):
        what = f" {_short(node.value)!r}" if isinstance(node.value, str) else ""
    if short == "timestamp":
        why = _EXPECTED["timestamp"] if isinstance(exc, (AttributeError, IndexError)) else f"{exc}"
        return f"invalid date/time{what}: {why}"
    if short == "int" and "Exceeds the limit" in str(exc):
        return f"invalid !!int value{what}: more than 4300 digits"
    return f"invalid {shown} value{what}: {_EXPECTED.get(short, 'it does not construct')}"


_MarkingLoader.add_constructor("tag:yaml.org,2002:null", _MarkingLoader.construct_yaml_null)


def load_yaml(path: str | Path, *, display: str | None = None) -> tuple[Any, Locator]:
    """Load one YAML document from ``path`` with the positions of its keys and items.

    Args:
        path: the file to read.
        display: how to name the file in errors (default: ``str(path)`` as given).

    Returns:
        (data, locator): plain Python data (dict/list/str/int/float/bool/None/date) and a
        :class:`Locator` for it. An empty file gives ``(None, Locator())``.

    Raises:
        ConfigError: the path is unusable (see :func:`path_problem`: too long, a folder, a
            device or FIFO, unreadable, over :data:`MAX_FILE_BYTES`), the file is not UTF-8, is
            not valid YAML (line and column set), has more than one document, a duplicate key in
            a mapping, a cyclic alias, a value its tag does not accept (``!!bool maybe``, at
            its line and column), or crosses a bound (depth, aliases, expanded values).
    """
    name = display if display is not None else display_path(path)
    problem = path_problem(path)
    if problem is not None:
        raise ConfigError(name, None, None, problem)
    try:
        # O_NONBLOCK: a FIFO swapped in after the check must not hang the open.
        fd = os.open(os.fspath(path), os.O_RDONLY | os.O_NONBLOCK)
        with os.fdopen(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                raise ConfigError(name, None, None, "not a regular file, expected a YAML file")
            raw = f.read(MAX_FILE_BYTES + 1)
    except ConfigError:
        raise
    except IsADirectoryError:
        raise ConfigError(name, None, None, "is a directory, expected a YAML file") from None
    except (OSError, ValueError) as exc:
        raise ConfigError(name, None, None, f"cannot read: {getattr(exc, 'strerror', None) or exc}") from None
    if len(raw) > MAX_FILE_BYTES:
        raise ConfigError(name, None, None, f"file too large (over {MAX_FILE_BYTES} bytes)")
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise ConfigError(name, line, None, f"not UTF-8 text (byte {exc.start})") from None
    return load_yaml_text(text, display=name)


_QUOTED = re.compile(r"'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"")


def _redact(msg: str) -> str:
    """A YAML problem without the fragments of the file it quotes (``found undefined alias
    'x'`` -> ``found undefined alias (text not shown)``)."""
    return _QUOTED.sub("(text not shown)", msg)


def load_yaml_text(text: str, *, display: str = "<string>") -> tuple[Any, Locator]:
    """Like :func:`load_yaml` for text already in memory; ``display`` names it in errors.
    Text longer than :data:`MAX_FILE_BYTES` characters is refused."""
    if len(text) > MAX_FILE_BYTES:
        raise ConfigError(display, None, None, f"text too large (over {MAX_FILE_BYTES} characters)")
    foreign = _FOREIGN.get()
    loader: _MarkingLoader | None = None
    try:
        loader = _MarkingLoader(text)
        node = loader.get_single_node()
        if node is None:
            return None, Locator()
        data = loader.construct_document(node)
        locator = Locator()
        _record(node, data, (), locator, display, set(), _KeyReader())
        return data, locator
    except _Bounded as exc:
        line, col = (exc.mark.line + 1, exc.mark.column + 1) if exc.mark is not None else (None, None)
        raise ConfigError(display, line, None, f"YAML: {exc.message}", column=col) from None
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
        if foreign:
            msg = _redact(msg)
        line, col = (mark.line + 1, mark.column + 1) if mark is not None else (None, None)
        raise ConfigError(display, line, None, f"YAML syntax: {msg}", column=col) from None
    except yaml.YAMLError as exc:  # ReaderError (control characters) and friends
        line = None
        text_before = text[: getattr(exc, "position", 0) or 0]
        if getattr(exc, "position", None) is not None:
            line = text_before.count("\n") + 1
        msg = _one_line(str(exc))
        raise ConfigError(display, line, None, f"YAML: {_redact(msg) if foreign else msg}") from None
    except RecursionError:  # not reached within MAX_DEPTH; kept as a last guard
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
    keys: "_KeyReader",
) -> None:
    """Walk ``node`` and its constructed ``data`` side by side, recording marks per path.
    (Bounded: the composer refused cycles and more than MAX_VALUES expanded values.)"""
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
                key = keys.key_of(key_node)
                if key is _NO_KEY or not _hashable(key):
                    continue
                if start <= key_node.start_mark.index < end:
                    if key in own_lines:
                        foreign = _FOREIGN.get()
                        raise ConfigError(
                            display,
                            key_node.start_mark.line + 1,
                            format_path(path + (key,)) if isinstance(key, (str, int)) and not foreign else None,
                            f"duplicate key{'' if foreign else f' {key!r}'} (first at line {own_lines[key]})",
                        )
                    own_lines[key] = key_node.start_mark.line + 1
                effective[key] = (key_node, value_node)
            for key, (key_node, value_node) in effective.items():
                child = path + (key,)
                locator.marks.setdefault(
                    child, (key_node.start_mark.line + 1, key_node.start_mark.column + 1)
                )
                if key in data:
                    _record(value_node, data[key], child, locator, display, active, keys)
        elif isinstance(node, yaml.SequenceNode) and isinstance(data, list):
            for i, (item_node, item) in enumerate(zip(node.value, data)):
                child = path + (i,)
                locator.marks.setdefault(
                    child, (item_node.start_mark.line + 1, item_node.start_mark.column + 1)
                )
                _record(item_node, item, child, locator, display, active, keys)
    finally:
        active.discard(id(node))


_NO_KEY = object()


class _KeyReader:
    """Resolves mapping-key scalars the way the constructor did (``1`` -> 1, ``true`` -> True),
    with one loader for the whole document (a loader per key cost more than the rest)."""

    def __init__(self) -> None:
        self._loader = _MarkingLoader("")
        self._cache: dict[tuple[str, str], Any] = {}

    def key_of(self, key_node: yaml.Node) -> Any:
        if not isinstance(key_node, yaml.ScalarNode):
            return _NO_KEY
        k = (key_node.tag, key_node.value)
        if k not in self._cache:
            try:
                self._cache[k] = self._loader.construct_object(key_node, deep=True)
            except yaml.YAMLError:
                self._cache[k] = _NO_KEY
        return self._cache[k]


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
    """``value`` for an error message, at most ``limit`` characters, on one line: a string is
    shown as typed unless it holds a control character (a CR, a tab, ...), then JSON-escaped."""
    if isinstance(value, str) and value.isprintable():
        s = value
    else:
        try:
            s = json.dumps(value, default=str)
        except (TypeError, ValueError):
            s = repr(value)
    return s if len(s) <= limit else s[: limit - 3] + "..."


def _message(err: Mapping[str, Any], quote: bool = True) -> str:
    """One pydantic error as a line a user can act on; ``quote=False``: nothing of the input
    (no "(got ...)", no unknown tag), only what was expected."""
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
        tag = f" {ctx.get('tag')!r}" if quote else ""
        return (
            f"unknown {str(ctx.get('discriminator', 'tag')).strip(chr(39))}{tag}; "
            f"expected one of: {ctx.get('expected_tags')}"
        )
    if not quote:
        return msg
    if typ == "union_tag_not_found":
        return f"required key {str(ctx.get('discriminator', 'tag')).strip(chr(39))!r} is missing"
    if typ.startswith("union_tag") or typ in ("model_type", "dict_type", "list_type"):
        return msg + (f" (got {_short(inp)})" if not isinstance(inp, (dict, list)) else "")
    if isinstance(inp, (str, int, float, bool)) or inp is None:
        return f"{msg} (got {_short(inp)})"
    return msg


def validation_problems(
    file: str | Path,
    exc: pydantic.ValidationError,
    locator: Locator,
    data: Any = None,
    *,
    skip_types: Iterable[str] = (),
    quote_values: bool = True,
) -> list[ConfigError]:
    """Every problem of a pydantic ValidationError on YAML data, one ConfigError each (file,
    line, field, message), in pydantic's order; errors of a type in ``skip_types`` are left
    out. Arguments otherwise as :func:`config_error_from_validation`."""
    skip = set(skip_types)
    quote = quote_values and not _FOREIGN.get()
    # Group by location: a plain union reports one error per member type at the same place.
    grouped: dict[tuple[int | None, str | None], list[str]] = {}
    for err in exc.errors(include_url=False):
        if err.get("type", "") in skip:
            continue
        loc = err.get("loc", ())
        path = _data_path(loc, data, err.get("type", "")) if data is not None else tuple(loc)
        key = (locator.line_of(path), format_path(path) or None)
        msg = _message(err, quote)
        if msg not in grouped.setdefault(key, []):
            grouped[key].append(msg)
    return [ConfigError(str(file), line, fld, "; or ".join(msgs)) for (line, fld), msgs in grouped.items()]


def combine_problems(problems: Sequence[ConfigError]) -> ConfigError:
    """One ConfigError holding every problem of ``problems`` (non-empty): the first describes
    file/line/field/message, ``problems`` lists all lines."""
    first = problems[0]
    return ConfigError(first.file, first.line, first.field, first.message, column=first.column,
                       problems=[line for p in problems for line in p.problems])


def config_error_from_validation(
    file: str | Path, exc: pydantic.ValidationError, locator: Locator, data: Any = None, *,
    quote_values: bool = True,
) -> ConfigError:
    """Turn a pydantic ValidationError on YAML data into a ConfigError.

    Args:
        file: the file name to print.
        exc: the error from ``model_validate(data)``.
        locator: from :func:`load_yaml` for the same data.
        data: the data that was validated; used to drop pydantic's union/tag steps from the
            path. Without it the raw ``loc`` is shown.
        quote_values: show the value a problem is about ("(got 3)"); False (and inside
            :func:`foreign_file`): name the key and what was expected only, for files that may
            be any file on the host (stack files).

    Returns:
        A ConfigError whose file/line/field/message describe the first problem and whose
        ``problems`` lists every problem, one ``file:line: field: message`` line each.
    """
    problems = validation_problems(file, exc, locator, data, quote_values=quote_values)
    if not problems:
        problems = [ConfigError(str(file), locator.line_of(()), None,
                                str(exc) if quote_values and not _FOREIGN.get() else "invalid")]
    return combine_problems(problems)


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
