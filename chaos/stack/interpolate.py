"""Compose-style variable interpolation: ``${VAR}``, ``${VAR:-default}``, ``${VAR-default}``,
``${VAR:?message}``, ``${VAR?message}``, ``$VAR`` and ``$$`` (a literal ``$``).

Semantics follow the Compose specification's "Interpolation" section (compose-spec,
``spec.md``): ``:-`` uses the default when the variable is unset *or empty*, ``-`` only when
unset; ``:?``/``?`` make a missing variable an error. Defaults may themselves contain
``${...}``. Only string scalars are interpolated; mapping keys are left alone, as Compose does.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping
from typing import Any

_NAME = r"[A-Za-z_][A-Za-z0-9_]*"
_BRACED_HEAD = re.compile(rf"\$\{{({_NAME})(?:(:?[-?])|(?=\}}))")
_PLAIN = re.compile(rf"\$({_NAME})")


class InterpolationError(ValueError):
    """A ``${VAR:?message}`` whose variable is missing, or a malformed ``${...}``.

    Attributes:
        variable: the variable's name ("" for a syntax error).
        message: what to tell the user (quotes the text and the ``:?`` message).
        unquoted: the same without any of the text (no name, no message): for a stack file,
            which a scenario's ``stack:`` may aim at any file on the host.
    """

    def __init__(self, variable: str, message: str, unquoted: str | None = None) -> None:
        self.variable = variable
        self.message = message
        self.unquoted = unquoted or message
        super().__init__(message)


def _braced_end(text: str, start: int) -> int:
    """Index of the ``}`` closing a ``${`` whose content starts at ``start`` (nesting allowed)."""
    depth = 1
    i = start
    while i < len(text):
        if text.startswith("${", i):
            depth += 1
            i += 2
            continue
        if text[i] == "}":
            depth -= 1
            if depth == 0:
                return i
        i += 1
    raise InterpolationError("", f"unclosed '${{' in {text!r}", "unclosed '${' (a '}' is missing)")


def interpolate(text: str, env: Mapping[str, str]) -> str:
    """Expand the variables of one string.

    Args:
        text: a string that may contain ``${...}``/``$NAME``/``$$``.
        env: the variables.

    Returns:
        The expanded string; an unset variable with no default expands to "".

    Raises:
        InterpolationError: a ``:?``/``?`` variable is missing, or a ``${`` is malformed.
    """
    out: list[str] = []
    i = 0
    while i < len(text):
        c = text[i]
        if c != "$":
            out.append(c)
            i += 1
            continue
        if text.startswith("$$", i):
            out.append("$")
            i += 2
            continue
        if text.startswith("${", i):
            m = _BRACED_HEAD.match(text, i)
            if not m:
                raise InterpolationError("", f"invalid interpolation format in {text!r}",
                                         "invalid interpolation format: '${' must be followed by a variable "
                                         "name and then '}', ':-', '-', ':?' or '?' ('$$' is a literal '$')")
            name, op = m.group(1), m.group(2)
            end = _braced_end(text, m.end())
            arg = text[m.end():end]
            value = env.get(name)
            if op is None:
                out.append(value or "")
            elif op in (":-", "-"):
                use_default = value is None or (op == ":-" and value == "")
                out.append(interpolate(arg, env) if use_default else value)
            else:  # ":?" or "?"
                missing = value is None or (op == ":?" and value == "")
                if missing:
                    msg = interpolate(arg, env) or "is required"
                    raise InterpolationError(name, f"variable {name} {msg}".strip(),
                                             "a variable this value requires (${NAME:?...}) is not set")
                out.append(value)
            i = end + 1
            continue
        m = _PLAIN.match(text, i)
        if m:
            out.append(env.get(m.group(1)) or "")
            i = m.end()
            continue
        out.append(c)
        i += 1
    return "".join(out)


def walk_strings(data: Any, path: tuple = ()) -> Iterator[tuple[tuple, str]]:
    """Yield ``(data_path, string)`` for every string scalar in nested dicts/lists."""
    if isinstance(data, str):
        yield path, data
    elif isinstance(data, dict):
        for k, v in data.items():
            yield from walk_strings(v, path + (k,))
    elif isinstance(data, list):
        for idx, v in enumerate(data):
            yield from walk_strings(v, path + (idx,))


def interpolate_data(data: Any, env: Mapping[str, str],
                     on_error: Callable[[tuple, InterpolationError], None] | None = None,
                     path: tuple = ()) -> Any:
    """Return a copy of ``data`` with every string scalar interpolated.

    Args:
        data: loaded YAML (dicts, lists, scalars).
        env: the variables.
        on_error: called with (data path, error) for a failing string; the string is then kept
            as it was. When None, the error propagates.

    Raises:
        InterpolationError: when ``on_error`` is None and a string fails.
    """
    if isinstance(data, str):
        try:
            return interpolate(data, env)
        except InterpolationError as exc:
            if on_error is None:
                raise
            on_error(path, exc)
            return data
    if isinstance(data, dict):
        return {k: interpolate_data(v, env, on_error, path + (k,)) for k, v in data.items()}
    if isinstance(data, list):
        return [interpolate_data(v, env, on_error, path + (i,)) for i, v in enumerate(data)]
    return data


_DEFAULTED = re.compile(rf"\$\{{({_NAME}):?-([^}}$]*)\}}")


def defaults_in(data: Any) -> dict[str, str]:
    """Variables given a literal default anywhere in ``data`` (``${NAME:-default}``).

    Returns:
        ``{name: default}``; the first default seen wins.
    """
    found: dict[str, str] = {}
    for _, s in walk_strings(data):
        for m in _DEFAULTED.finditer(s):
            found.setdefault(m.group(1), m.group(2))
    return found


def variables_in(data: Any) -> set[str]:
    """Names of every variable referenced anywhere in ``data`` (``${NAME...}`` or ``$NAME``,
    also inside defaults; ``$$`` is a literal dollar, not a reference).

    Returns:
        The set of names (what a stack file *reads*: a scenario variable outside it reaches no
        service).
    """
    found: set[str] = set()
    for _, s in walk_strings(data):
        text = s.replace("$$", "")
        found.update(m.group(1) for m in _BRACED_HEAD.finditer(text))
        found.update(m.group(1) for m in _PLAIN.finditer(text))
    return found

