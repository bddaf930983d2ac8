"""Reading Prometheus text exposition (``/metrics``) of the services under test, with
prometheus_client's own parser: fault evidence is often a counter's delta."""

from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families


def scrape_counters(url: str, names: list[str], *, labels: dict[str, str] | None = None,
                    timeout_s: float = 5.0) -> dict[str, float | None]:
    """Read Prometheus text from ``url`` and sum each named sample over its label sets.

    Args:
        url: a ``/metrics`` URL (Prometheus text exposition format).
        names: sample names, e.g. ``vllm:num_preemptions_total`` (counters with ``_total``).
        labels: only samples carrying these label values count.
        timeout_s: HTTP timeout, seconds.

    Returns:
        ``{name: sum}``; None for a name with no sample.

    Raises:
        httpx.HTTPError: the endpoint did not answer with 2xx.
        ValueError: the body is not Prometheus text.
    """
    r = httpx.get(url, timeout=timeout_s)
    r.raise_for_status()
    out: dict[str, float | None] = {n: None for n in names}
    want = set(names)
    for name, sample_labels, value in text_samples(r.text):
        if name not in want:
            continue
        if labels and any(sample_labels.get(k) != v for k, v in labels.items()):
            continue
        out[name] = (out[name] or 0.0) + value
    return out


def text_samples(text: str) -> list[tuple[str, dict[str, str], float]]:
    """Every sample of a Prometheus text exposition as ``(name, labels, value)``.

    Raises:
        ValueError: ``text`` is not Prometheus text.
    """
    return [(s.name, dict(s.labels), float(s.value))
            for family in text_string_to_metric_families(text) for s in family.samples]
