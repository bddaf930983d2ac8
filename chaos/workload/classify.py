"""Request classes from a completion op: what path through the cache a request took.

From the engine's ``kv_transfer_params.cached_token_stats`` (docs/architecture.md section 2):
``local_cache_hit_tokens`` (engine's own prefix cache), ``external_cache_hit_tokens``
(LMCache), ``lookup`` (hit|miss|timeout|error|disabled), ``load_failed_tokens``.
"""

from __future__ import annotations

from typing import Any, Literal

from chaos.history import Op

__all__ = ["RequestClass", "REQUEST_CLASSES", "classify", "classify_value"]

RequestClass = Literal[
    "cold_miss",
    "local_hit",
    "lmcache_hit_full",
    "lmcache_hit_partial",
    "lookup_timeout",
    "load_failure_recompute",
    "failed",
    "aborted",
]
REQUEST_CLASSES: tuple[str, ...] = RequestClass.__args__  # type: ignore[attr-defined]


def classify_value(type_: str, value: dict[str, Any]) -> RequestClass:
    """Class of a completion outcome given its op type and value (see :func:`classify`)."""
    if value.get("aborted"):
        return "aborted"
    if type_ != "ok":
        return "failed"
    stats = value.get("cached_token_stats") or {}
    local = int(stats.get("local_cache_hit_tokens") or 0)
    external = int(stats.get("external_cache_hit_tokens") or 0)
    if stats.get("lookup") == "timeout":
        return "lookup_timeout"
    if int(stats.get("load_failed_tokens") or 0) > 0:
        return "load_failure_recompute"
    if external > 0:
        prompt_len = int(value.get("prompt_len") or 0)
        # An engine computes at least the last prompt token, so a full hit covers len - 1.
        return "lmcache_hit_full" if local + external >= prompt_len - 1 else "lmcache_hit_partial"
    if local > 0:
        return "local_hit"
    return "cold_miss"


def classify(op: Op) -> RequestClass:
    """Class of a request from its ok/fail/info op (f="complete").

    Order of precedence: aborted (info with ``aborted``), failed (fail, or info not aborted),
    lookup_timeout (lookup == "timeout"), load_failure_recompute (load_failed_tokens > 0),
    lmcache_hit_full (local + external hit tokens >= prompt_len - 1), lmcache_hit_partial
    (external > 0), local_hit (local > 0), cold_miss.

    Raises:
        ValueError: ``op`` is an invoke or not a completion.
    """
    if op.f != "complete" or op.type == "invoke":
        raise ValueError(f"classify needs a completion's ok/fail/info op, got {op.type}/{op.f}")
    return classify_value(op.type, op.value)
