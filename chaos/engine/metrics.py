"""Engine counters and gauges, rendered in Prometheus text format under vLLM's names.

Names and meanings follow vLLM V1's ``vllm/v1/metrics/loggers.py`` (PrometheusStatLogger):
prefix-cache queries/hits count *tokens*; ``vllm:kv_cache_usage_perc`` is a 0..1 fraction.
Every vLLM series carries the ``model_name`` label as vLLM's do. ``kvchaos_engine_*`` are ours.
"""

from __future__ import annotations

import threading
from collections import defaultdict

_HELP = {
    "vllm:num_requests_running": ("gauge", "Requests in model execution batches."),
    "vllm:num_requests_waiting": ("gauge", "Requests waiting to be processed."),
    "vllm:kv_cache_usage_perc": ("gauge", "KV-cache usage. 1 means 100 percent usage."),
    "vllm:num_preemptions_total": ("counter", "Cumulative number of preemptions."),
    "vllm:prefix_cache_queries_total": ("counter", "Prefix cache queries, in tokens."),
    "vllm:prefix_cache_hits_total": ("counter", "Prefix cache hits, in tokens."),
    "vllm:external_prefix_cache_queries_total": (
        "counter", "External prefix cache (KV connector) queries, in tokens."),
    "vllm:external_prefix_cache_hits_total": (
        "counter", "External prefix cache (KV connector) hits, in tokens."),
    "vllm:request_success_total": ("counter", "Successfully processed requests."),
    "vllm:prompt_tokens_total": ("counter", "Prefill tokens processed."),
    "vllm:generation_tokens_total": ("counter", "Generation tokens processed."),
    "kvchaos_engine_lookup_timeouts_total": ("counter", "LMCache lookups that timed out."),
    "kvchaos_engine_lookup_errors_total": (
        "counter", "LMCache lookups not sent or failed (server unreachable/unhealthy)."),
    "kvchaos_engine_load_failures_total": ("counter", "LMCache retrieves that failed."),
    "kvchaos_engine_load_failed_tokens_total": ("counter", "Tokens whose LMCache load failed."),
    "kvchaos_engine_store_failures_total": ("counter", "LMCache stores that failed."),
    "kvchaos_engine_stored_tokens_total": ("counter", "Tokens submitted to LMCache stores."),
    "kvchaos_engine_end_sessions_lost_total": (
        "counter", "END_SESSIONs of held LMCache sessions never answered while a later PING was "
        "(lost with their connection)."),
    "kvchaos_engine_lock_frees_lost_total": (
        "counter", "FREE_LOOKUP_LOCKS of held LMCache sessions never answered while a later PING "
        "was (lost with their connection: the read locks stay until their TTL)."),
    "kvchaos_engine_aborts_total": ("counter", "Requests aborted (client disconnect or error)."),
    "kvchaos_engine_replay_mismatches_total": (
        "counter", "Resumed requests whose recomputed token differed from the one sent."),
    "kvchaos_engine_lmcache_healthy": ("gauge", "1 when the LMCache connector is healthy."),
    "kvchaos_engine_lmcache_heartbeats": (
        "gauge", "LMCache adapters (scheduler, worker) whose heartbeat runs: 0 until the first lookup."),
}


class Metrics:
    """Thread-safe counters; gauges are set by the scheduler each step."""

    def __init__(self, model_name: str) -> None:
        """Args: model_name: value of the ``model_name`` label."""
        self.model_name = model_name
        self._lock = threading.Lock()
        self._values: dict[tuple[str, tuple[tuple[str, str], ...]], float] = defaultdict(float)

    def inc(self, name: str, amount: float = 1.0, **labels: str) -> None:
        """Add ``amount`` to counter ``name`` (must be in the catalogue)."""
        assert name in _HELP, name
        with self._lock:
            self._values[(name, tuple(sorted(labels.items())))] += amount

    def set(self, name: str, value: float, **labels: str) -> None:
        """Set gauge ``name``."""
        assert name in _HELP, name
        with self._lock:
            self._values[(name, tuple(sorted(labels.items())))] = value

    def get(self, name: str, **labels: str) -> float:
        """Current value (0 when never touched)."""
        with self._lock:
            return self._values.get((name, tuple(sorted(labels.items()))), 0.0)

    def render(self) -> str:
        """Prometheus text exposition (version 0.0.4)."""
        lines: list[str] = []
        with self._lock:
            values = dict(self._values)
        for name, (kind, text) in _HELP.items():
            lines.append(f"# HELP {name} {text}")
            lines.append(f"# TYPE {name} {kind}")
            series = {k: v for k, v in values.items() if k[0] == name}
            if not series:
                series = {(name, ()): 0.0}
            for (_, labels), value in sorted(series.items()):
                all_labels = (("model_name", self.model_name),) + labels \
                    if name.startswith("vllm:") else labels
                label_text = ",".join(f'{k}="{v}"' for k, v in all_labels)
                label_text = "{" + label_text + "}" if label_text else ""
                lines.append(f"{name}{label_text} {value!r}")
        return "\n".join(lines) + "\n"
