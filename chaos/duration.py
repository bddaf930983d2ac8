"""Durations as users write them: ``"500ms"``, ``"8s"``, ``"1m"``, ``"1m30s"`` or a number of seconds.

Stored as float seconds. Units: ``us``, ``ms``, ``s``, ``m``, ``h`` (the compose-file units),
combinable largest first (``1h2m3.5s``). Two annotated types carry the bound in their error
message, so a user sees ``must be positive (got -3s)`` with the text they typed.
"""

from __future__ import annotations

import math
import re
from typing import Annotated, Any

from pydantic import BeforeValidator, WithJsonSchema

__all__ = ["parse_duration", "Duration", "PositiveDuration", "format_duration"]

_UNIT_S = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(us|ms|s|m|h)")
_WHOLE = re.compile(r"^([+-]?)((?:(?:\d+(?:\.\d*)?|\.\d+)(?:us|ms|s|m|h))+)$")
_UNIT_ORDER = ["h", "m", "s", "ms", "us"]


def parse_duration(value: Any) -> float:
    """Parse a duration to float seconds (may be negative; the bound is checked by the types).

    Accepts int/float seconds, numeric strings (``"2.5"``) and unit strings (``"1m30s"``).

    Raises:
        ValueError: not a duration (message names the accepted forms), NaN or infinite.
    """
    if isinstance(value, bool):
        raise ValueError(f"expected a duration like 500ms, 8s, 1m30s or seconds (got {value})")
    if isinstance(value, (int, float)):
        seconds = float(value)
    elif isinstance(value, str):
        text = value.strip().replace(" ", "")
        try:
            seconds = float(text)
        except ValueError:
            m = _WHOLE.match(text)
            if not m:
                raise ValueError(
                    f"expected a duration like 500ms, 8s, 1m30s or seconds (got {value!r})"
                ) from None
            units = [u for _, u in _PART.findall(m.group(2))]
            order = [_UNIT_ORDER.index(u) for u in units]
            if order != sorted(set(order)) or len(order) != len(set(order)):
                raise ValueError(
                    f"duration units must go from largest to smallest, each once (got {value!r})"
                )
            seconds = sum(float(n) * _UNIT_S[u] for n, u in _PART.findall(m.group(2)))
            if m.group(1) == "-":
                seconds = -seconds
    else:
        raise ValueError(
            f"expected a duration like 500ms, 8s, 1m30s or seconds (got {type(value).__name__})"
        )
    if math.isnan(seconds) or math.isinf(seconds):
        raise ValueError(f"duration must be finite (got {value})")
    return seconds


def _non_negative(value: Any) -> float:
    seconds = parse_duration(value)
    if seconds < 0:
        raise ValueError(f"must be zero or positive (got {value})")
    return seconds


def _positive(value: Any) -> float:
    seconds = parse_duration(value)
    if seconds <= 0:
        raise ValueError(f"must be positive (got {value})")
    return seconds


_SCHEMA = {
    "anyOf": [
        {"type": "number"},
        {
            "type": "string",
            "pattern": r"^\s*(\d+(\.\d*)?|\.\d+)?((\d+(\.\d*)?|\.\d+)(us|ms|s|m|h))*\s*$",
        },
    ],
    "description": "duration: seconds as a number, or a string like 500ms, 8s, 1m, 1m30s",
}

Duration = Annotated[float, BeforeValidator(_non_negative), WithJsonSchema({**_SCHEMA})]
"""A duration >= 0 seconds (e.g. a fault's ``start``)."""

PositiveDuration = Annotated[float, BeforeValidator(_positive), WithJsonSchema({**_SCHEMA})]
"""A duration > 0 seconds (e.g. a fault's ``duration``)."""


def format_duration(seconds: float) -> str:
    """Render float seconds for people: ``0.5`` -> ``"500ms"``, ``90`` -> ``"1m30s"``; ten
    significant digits, so that :func:`parse_duration` gives the value back within 1e-9 relative
    (``:g``'s six lost microseconds: 3.5198556 s rendered "3.51986s")."""
    if seconds < 1 and seconds != 0:
        return f"{seconds * 1000:.10g}ms"
    minutes, secs = divmod(seconds, 60)
    if minutes >= 1:
        return f"{int(minutes)}m{secs:.10g}s" if secs else f"{int(minutes)}m"
    return f"{secs:.10g}s"
