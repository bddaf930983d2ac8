from __future__ import annotations

import pydantic
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chaos.duration import Duration, PositiveDuration, format_duration, parse_duration


@pytest.mark.parametrize(
    "text, seconds",
    [
        ("500ms", 0.5),
        ("8s", 8.0),
        ("1m", 60.0),
        ("1m30s", 90.0),
        ("1h2m3.5s", 3723.5),
        ("250us", 0.00025),
        ("2.5", 2.5),
        (3, 3.0),
        (0.25, 0.25),
        ("-3s", -3.0),
        (" 8s ", 8.0),
    ],
)
def test_parse(text, seconds):
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("bad", ["", "8", "s", "8x", "1s1m", "1s1s", "8 seconds", "nan", "inf", True, None, [1]])
def test_parse_rejects(bad):
    if bad == "8":  # a bare number string is seconds
        assert parse_duration(bad) == 8.0
        return
    with pytest.raises(ValueError):
        parse_duration(bad)


class _M(pydantic.BaseModel):
    start: Duration = 0.0
    duration: PositiveDuration | None = None


def test_bounds_messages_show_what_was_typed():
    with pytest.raises(pydantic.ValidationError, match=r"must be positive \(got -3s\)"):
        _M(duration="-3s")
    with pytest.raises(pydantic.ValidationError, match=r"must be positive \(got 0\)"):
        _M(duration=0)
    with pytest.raises(pydantic.ValidationError, match=r"must be zero or positive \(got -1\)"):
        _M(start=-1)
    assert _M(start="0s", duration="1m30s").duration == 90.0


@settings(max_examples=200, deadline=None)
@given(st.floats(min_value=0.001, max_value=1e6, allow_nan=False))
def test_format_round_trips(seconds):
    assert parse_duration(format_duration(seconds)) == pytest.approx(seconds, rel=1e-6, abs=1e-6)


@pytest.mark.parametrize("seconds", [3.5198556376404326, 23.51146802656017, 0.0012345678901])
def test_format_keeps_the_microseconds(seconds):
    """The inputs that showed it (hypothesis, on main): ``:g`` kept six significant digits."""
    assert parse_duration(format_duration(seconds)) == pytest.approx(seconds, rel=1e-9, abs=1e-9)
    assert format_duration(90) == "1m30s" and format_duration(0.5) == "500ms" and format_duration(8) == "8s"
