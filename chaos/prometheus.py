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
    for family in text_string_to_metric_families(r.text):
        for s in family.samples:
            if s.name not in want:
                continue
            if labels and any(s.labels.get(k) != v for k, v in labels.items()):
                continue
            out[s.name] = (out[s.name] or 0.0) + float(s.value)
    return out
