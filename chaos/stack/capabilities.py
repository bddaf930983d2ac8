"""Stack capabilities: what a stack's services offer, and what faults, checks and scenarios need.

    stack file x-kvchaos.capabilities: [engine.hooks.preempt, ...]   (declared)
               + what other x-kvchaos settings imply (lmcache_http, l2_fs_path, redis, ...)
               + the variables the file reads (${ENGINE_NUM_BLOCKS:-...} -> var:ENGINE_NUM_BLOCKS)
        └─> StackSpec.capabilities()  ── a set of names
                                              │
    scenario: each fault's needs (Fault.capability_needs(params)), each check's needs
    (CheckSpec.needs_for(config)), its variables and engine options ─> needed names
                                              │
    chaos.scenario.loader.validate_against_stack: every needed name the stack lacks is a
    ConfigError at the line that needs it (exit 2, nothing starts)

A capability is a dotted name from :data:`CAPABILITIES` (say what, not how), or
``var:NAME``: the stack file reads variable ``NAME`` (so a scenario's ``variables:`` or engine
option reaches a service). A fault kind or check that needs something new adds its name here
with one line saying what the stack must offer; the stack files that offer it list it under
``x-kvchaos.capabilities``. Unknown names are an error in both places (a typo must never turn a
requirement off).
"""

from __future__ import annotations

__all__ = ["CAPABILITIES", "DERIVED", "VARIABLE_PREFIX", "describe", "is_known", "variable_need"]

VARIABLE_PREFIX = "var:"

#: Every capability name a stack may declare or a fault/check may need -> what it means.
CAPABILITIES: dict[str, str] = {
    # The engine's HTTP surface beyond the OpenAI completions API.
    "engine.metrics": "GET {engine_url}/metrics: Prometheus text with the names in "
                      "x-kvchaos.engine_metrics (preemptions, running/waiting requests, hits)",
    "engine.kvchaos_metrics": "the reference engine's own counters on {engine_url}/metrics "
                              "(kvchaos_engine_lookup_timeouts_total, ..._load_failures_total, "
                              "..._aborts_total; docs/reach.md), which triggers may probe",
    "engine.debug_state": "GET {engine_url}/debug/state: JSON engine state (blocks, sessions, "
                          "pending lookups), and GET /debug/requests/{id}: a request's state "
                          "(lookup, load, prefill, decode), as the reference engine serves them",
    "engine.hooks.preempt": "POST {engine_url}/hooks/preempt: preempt running requests now "
                            "(reference engine fault hook)",
    "engine.hooks.stall": "POST {engine_url}/hooks/stall: hold the scheduler before lookup, "
                          "retrieve or store (reference engine fault hook)",
    "engine.hooks.lmcache": "POST {engine_url}/hooks/lmcache: the engine makes one raw call of "
                            "LMCache's scheduler adapter (free_lookup_locks, lookup_then_end_session; "
                            "reference engine fault hook)",
    "engine.reset_prefix_cache": "POST {engine_url}/reset_prefix_cache: empty the engine's own "
                                 "prefix cache (vLLM: needs VLLM_SERVER_DEV_MODE=1)",
    "engine.cache_stats": "per-request cache accounting in the completion "
                          "(kv_transfer_params.cached_token_stats: local and LMCache hit tokens)",
    "engine.cache_stats.stream": "the same accounting in streamed completions too (the last SSE "
                                 "event's kv_transfer_params); vLLM 0.32's streamed completions "
                                 "carry no kv_transfer_params (CompletionStreamResponse has no such "
                                 "field), so hit checks of its streamed requests stay undecided",
    "engine.cache_salt": "the completions API takes cache_salt and keys both caches on it",
    "engine.logprobs": "the completions API returns top-k logprobs per generated token, tokens "
                       "spelled token_id:N (vLLM's return_tokens_as_token_ids)",
    "engine.planted_bugs": "the engine can be started with planted bugs (KVCHAOS_ENGINE_BUGS; "
                           "the set is x-kvchaos.planted_bugs: reference (chaos/engine/bugs.py) or "
                           "vllm (chaos/vllm/bugs.py))",
    # LMCache's MP server.
    "lmcache.http": "LMCache's HTTP API at x-kvchaos.lmcache_http (/status, /cache/clear, "
                    "/metrics)",
    "lmcache.l2_wrap": "the LMCache service's --l2-adapter arguments are written "
                       "'${NAME_WRAP:-}{...}${NAME_WRAP_END:-}', so that kvchaos can restart it with "
                       "LMCache's fault_inject adapter around them (l2_fault_inject; docs/reach.md)",
    # L2 tiers.
    "l2.fs": "a filesystem L2 whose folder kvchaos can reach (x-kvchaos.l2_fs_path)",
    "l2.fs.size_cap": "the filesystem L2 is a size-capped mount kvchaos can fill "
                      "(x-kvchaos.l2_fs_size)",
    "l2.redis": "a Redis L2 kvchaos can reach (x-kvchaos.redis)",
    # Oracles and state.
    "recompute": "a recompute twin (x-kvchaos.recompute_url): same model, cache off",
    "leak_sources": "at least one leak source (x-kvchaos.leak_sources)",
}

#: Capabilities a stack has because of another x-kvchaos setting (never declared by hand).
DERIVED: dict[str, str] = {
    "lmcache.http": "lmcache_http",
    "l2.fs": "l2_fs_path",
    "l2.fs.size_cap": "l2_fs_size",
    "l2.redis": "redis",
    "recompute": "recompute_url",
    "leak_sources": "leak_sources",
}


def variable_need(name: str) -> str:
    """The capability "the stack file reads variable ``name``" (``var:NAME``)."""
    return f"{VARIABLE_PREFIX}{name}"


def is_known(name: str) -> bool:
    """True for a name in :data:`CAPABILITIES` or a ``var:NAME``."""
    return name in CAPABILITIES or (name.startswith(VARIABLE_PREFIX) and len(name) > len(VARIABLE_PREFIX))


def describe(name: str) -> str:
    """One line for an error message: ``name (what it means)``."""
    if name.startswith(VARIABLE_PREFIX):
        var = name[len(VARIABLE_PREFIX):]
        return f"{name} (the stack file must read variable {var}, e.g. ${{{var}:-default}})"
    what = CAPABILITIES.get(name)
    if what is None:
        return name
    derived = DERIVED.get(name)
    how = f"a stack has it when it sets x-kvchaos.{derived}" if derived else \
        "a stack that has it lists it under x-kvchaos.capabilities"
    return f"{name} [{what}; {how}]"
