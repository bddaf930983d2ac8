"""Request classes from a completion op: what path through the cache a request took.

From the engine's ``kv_transfer_params.cached_token_stats`` (docs/architecture.md section 2):
``local_cache_hit_tokens`` (engine's own prefix cache), ``external_cache_hit_tokens``
(LMCache), ``lookup`` (hit|miss|timeout|error|disabled), ``load_failed_tokens``. vLLM with
LMCache's MP connector reports ``num_vllm_cached_tokens``, ``num_lmcache_cached_tokens`` and
``num_lmcache_extra_cached_tokens`` instead (``LMCacheMPConnector.request_finished``);
:func:`normalize_cache_stats` maps them onto the names above.
"""

from __future__ import annotations

from typing import Any, Literal

from chaos.history import Op

__all__ = ["RequestClass", "REQUEST_CLASSES", "classify", "classify_value", "normalize_cache_stats"]

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


def normalize_cache_stats(raw: dict[str, Any]) -> dict[str, Any]:
    """``cached_token_stats`` in the reference engine's names, from either engine's form.

    LMCache's MP connector (vLLM): ``num_vllm_cached_tokens`` is the engine's own prefix-cache
    hit, ``num_lmcache_extra_cached_tokens`` what LMCache served beyond it (its
    ``num_lmcache_cached_tokens`` counts the overlap too). Keys of the reference form win.
    """
    if "num_vllm_cached_tokens" not in raw and "num_lmcache_extra_cached_tokens" not in raw:
        return raw
    out = {"local_cache_hit_tokens": int(raw.get("num_vllm_cached_tokens") or 0),
           "external_cache_hit_tokens": int(raw.get("num_lmcache_extra_cached_tokens") or 0)}
    out.update({k: v for k, v in raw.items() if not k.startswith("num_")})
    return out


def classify_value(type_: str, value: dict[str, Any]) -> RequestClass:
    """Class of a completion outcome given its op type and value (see :func:`classify`)."""
    if value.get("aborted"):
        return "aborted"
    if type_ != "ok":
        return "failed"
    stats = normalize_cache_stats(value.get("cached_token_stats") or {})
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
