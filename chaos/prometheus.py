"""Reading Prometheus text exposition (``/metrics``) of the services under test, with
prometheus_client's own parser: fault evidence is often a counter's delta, and a leak source
may be a gauge that must come back to its baseline.

    /metrics text ─ text_string_to_metric_families ─ samples (name, labels, value)
    selector  'vllm:num_requests_running{model_name=~".+"}' ─ parse_selector ─ Selector
    Selector.matches(sample) over every sample ─> sum (None when no sample matches)
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

import httpx
from prometheus_client.parser import text_string_to_metric_families

__all__ = ["Selector", "parse_selector", "check_selectors", "sum_selectors", "scrape_selectors", "scrape_counters"]

_SELECTOR = re.compile(r"^\s*([a-zA-Z_:][a-zA-Z0-9_:]*)\s*(?:\{(.*)\})?\s*$", re.S)
_MATCHER = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"\s*(,|$)')


@dataclass(frozen=True)
class Selector:
    """A PromQL instant-vector selector without functions: a sample name and label matchers.

    Attributes:
        name: the sample name (counters with their ``_total`` suffix).
        matchers: ``(label, op, value)`` with op ``=``, ``!=``, ``=~`` or ``!~``; regexes are
            anchored at both ends, as in PromQL.
    """

    name: str
    matchers: tuple[tuple[str, str, str], ...] = ()

    def matches(self, name: str, labels: Mapping[str, str]) -> bool:
        """True when a sample with this name and these labels is selected (a missing label
        reads as "", as in PromQL)."""
        if name != self.name:
            return False
        for label, op, value in self.matchers:
            got = labels.get(label, "")
            if op == "=" and got != value:
                return False
            if op == "!=" and got == value:
                return False
            if op == "=~" and re.fullmatch(value, got) is None:
                return False
            if op == "!~" and re.fullmatch(value, got) is not None:
                return False
        return True

    def __str__(self) -> str:
        if not self.matchers:
            return self.name
        inner = ",".join(f'{k}{op}"{v}"' for k, op, v in self.matchers)
        return f"{self.name}{{{inner}}}"


def parse_selector(text: str) -> Selector:
    """Parse ``name`` or ``name{label="v",other=~"re"}``.

    Raises:
        ValueError: not a selector, a malformed matcher, or an invalid regex.
    """
    m = _SELECTOR.match(text or "")
    if not m:
        raise ValueError(f"not a Prometheus selector: {text!r} (use name or name{{label=\"value\"}})")
    name, body = m.group(1), m.group(2)
    matchers: list[tuple[str, str, str]] = []
    if body is not None and body.strip():
        pos = 0
        while pos < len(body):
            mm = _MATCHER.match(body, pos)
            if not mm:
                raise ValueError(f"bad label matcher in {text!r} at {body[pos:]!r} "
                                 '(use label="v", label!="v", label=~"re" or label!~"re")')
            label, op, value = mm.group(1), mm.group(2), mm.group(3).replace('\\"', '"')
            if op in ("=~", "!~"):
                try:
                    re.compile(value)
                except re.error as exc:
                    raise ValueError(f"bad regex {value!r} in {text!r}: {exc}") from None
            matchers.append((label, op, value))
            pos = mm.end()
            if not mm.group(4):
                break
        if pos < len(body) and body[pos:].strip():
            raise ValueError(f"bad label matchers in {text!r}")
    return Selector(name, tuple(matchers))


def check_selectors(fields: Mapping[str, str]) -> None:
    """Parse every selector of a ``{reported name: selector}`` map.

    Raises:
        ValueError: naming the first field whose selector does not parse.
    """
    for name, sel in fields.items():
        try:
            parse_selector(sel)
        except ValueError as exc:
            raise ValueError(f"fields.{name}: {exc}") from None


def sum_selectors(text: str, selectors: Mapping[str, str | Selector]) -> dict[str, float | None]:
    """Sum, for each selector, the samples of Prometheus text ``text`` it selects.

    Args:
        text: a ``/metrics`` body (Prometheus text exposition format 0.0.4).
        selectors: reported name -> selector (text or parsed).

    Returns:
        ``{reported name: sum}``; None where no sample matched.

    Raises:
        ValueError: the body is not Prometheus text, or a selector does not parse.
    """
    parsed = {k: (v if isinstance(v, Selector) else parse_selector(v)) for k, v in selectors.items()}
    out: dict[str, float | None] = {k: None for k in parsed}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            for key, sel in parsed.items():
                if sel.matches(s.name, s.labels):
                    out[key] = (out[key] or 0.0) + float(s.value)
    return out


def scrape_selectors(url: str, selectors: Mapping[str, str | Selector], *, timeout_s: float = 5.0,
                     client: httpx.Client | None = None) -> dict[str, float | None]:
    """GET ``url`` and :func:`sum_selectors` its body.

    Raises:
        httpx.HTTPError: the endpoint did not answer with 2xx.
        ValueError: the body is not Prometheus text.
    """
    r = client.get(url) if client is not None else httpx.get(url, timeout=timeout_s)
    r.raise_for_status()
    return sum_selectors(r.text, selectors)


def scrape_counters(url: str, names: list[str], *, labels: dict[str, str] | None = None,
                    timeout_s: float = 5.0) -> dict[str, float | None]:
    """Read Prometheus text from ``url`` and sum each named sample over its label sets.

    Args:
        url: a ``/metrics`` URL (Prometheus text exposition format).
        names: sample names, e.g. ``vllm:num_preemptions_total`` (counters with ``_total``),
            or selectors with label matchers (``name{label="v"}``).
        labels: only samples carrying these label values count.
        timeout_s: HTTP timeout, seconds.

    Returns:
        ``{name: sum}``; None for a name with no sample.

    Raises:
        httpx.HTTPError: the endpoint did not answer with 2xx.
        ValueError: the body is not Prometheus text.
    """
    selectors = {}
    for n in names:
        sel = parse_selector(n)
        extra = tuple((k, "=", v) for k, v in (labels or {}).items())
        selectors[n] = Selector(sel.name, sel.matchers + extra)
    return scrape_selectors(url, selectors, timeout_s=timeout_s)


def text_samples(text: str) -> list[tuple[str, dict[str, str], float]]:
    """Every sample of a Prometheus text exposition as ``(name, labels, value)``.

    Raises:
        ValueError: ``text`` is not Prometheus text.
    """
    return [(s.name, dict(s.labels), float(s.value))
            for family in text_string_to_metric_families(text) for s in family.samples]
