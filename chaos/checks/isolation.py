"""isolation: no KV reuse across tenants (cache_salt).

A cache key that lacks tenant identity (F12: salt or adapter missing from the key) lets tenant
B's request load KV that tenant A computed. The engine reports how much of each prompt it did
not compute (`local_cache_hit_tokens + external_cache_hit_tokens`); a legitimate hit can only
cover tokens that some request of the same tenant already ran through the engine. So for each
completed request with hit tokens > 0, the hit length must not exceed the longest common prefix
(LCP) of its prompt with a same-tenant source sequence:

- sources: requests of the same tenant invoked before this one completed (KV is stored after
  prefill, so a concurrent request can be a source); their sequence is prompt + output tokens
  when they completed (the local prefix cache also holds decoded blocks), else the prompt;
- the request itself after a preemption (it may reload its own stored chunks).

No rounding to chunk/block size is applied: a legitimate hit is at most the LCP, so the bound
is already loose in the request's favour; it never flags a hit that same-tenant reuse explains.
A hit longer than every same-tenant LCP is cross-tenant (or phantom) reuse: failed, naming the
other tenant's request whose prefix covers the hit when there is one. That each tenant's output
equals its own recompute is recompute_equivalence's job.

Verdicts: failed on any unexplained hit; unknown when no request completed or a hit request
has no prompt token ids in the history; else passed.
"""

from __future__ import annotations

import os
from typing import Any, Sequence

from chaos.checks.config import IsolationConfig
from chaos.checks.registry import coerce_config, register
from chaos.checks.requests import RequestRecord, requests
from chaos.checks.result import CheckResult
from chaos.checks.snapshots import Snapshots
from chaos.history import Op

NAME = "isolation"


def common_prefix_len(a: list[int], b: list[int]) -> int:
    """Number of leading tokens `a` and `b` share."""
    return len(os.path.commonprefix([a, b]))


def _sequence(rec: RequestRecord) -> list[int]:
    seq = list(rec.prompt_token_ids or [])
    if rec.outcome == "ok" and rec.token_ids:
        seq += rec.token_ids
    return seq


def _best_source(rec: RequestRecord, pool: list[RequestRecord]) -> tuple[int, RequestRecord | None]:
    prompt = rec.prompt_token_ids or []
    best, who = 0, None
    for s in pool:
        n = common_prefix_len(prompt, _sequence(s))
        if n > best:
            best, who = n, s
    return best, who


def _name(tenant: str | None) -> str:
    return "(no salt)" if tenant is None else tenant


@register(NAME, IsolationConfig, needs=("engine.cache_stats",))
def check(history: Sequence[Op | dict[str, Any]], snapshots: Snapshots,
          config: IsolationConfig | dict[str, Any] | None = None) -> CheckResult:
    """Flag cache hits that no earlier same-tenant request explains.

    Args:
        history: the run's ops; invoke values need `prompt_token_ids` (or the ok value does)
            and `cache_salt` / `tenant`.
        snapshots: unused.
        config: IsolationConfig (no settings) or None.
    Returns:
        CheckResult; details: `tenants`, `hit_requests` (count examined), `violations` (list of
        {request_id, tenant, hit_tokens, same_tenant_lcp, same_tenant_source, other_tenant,
        other_request_id, other_lcp}), `undecidable` (ids without prompt tokens).
    """
    coerce_config(config, IsolationConfig)
    reqs = requests(history)
    done = [r for r in reqs if r.outcome == "ok"]
    tenants = sorted({_name(r.tenant) for r in reqs})
    violations: list[dict[str, Any]] = []
    undecidable: list[str] = []
    examined = 0
    for rec in done:
        hit = rec.hit_tokens
        if hit <= 0:
            continue
        if not rec.prompt_token_ids:
            undecidable.append(rec.request_id)
            continue
        examined += 1
        end = rec.end_time if rec.end_time is not None else float("inf")
        earlier = [s for s in reqs if s.invoke_time < end and s.prompt_token_ids
                   and (s.request_id != rec.request_id
                        or (rec.cached_token_stats and rec.cached_token_stats.num_preemptions > 0))]
        same = [s for s in earlier if s.tenant == rec.tenant]
        lcp, src = _best_source(rec, same)
        if hit <= lcp:
            continue
        other_lcp, other = _best_source(rec, [s for s in earlier if s.tenant != rec.tenant])
        violations.append({
            "request_id": rec.request_id, "tenant": rec.tenant, "hit_tokens": hit,
            "cached_token_stats": rec.cached_token_stats.model_dump() if rec.cached_token_stats else None,
            "same_tenant_lcp": lcp, "same_tenant_source": src.request_id if src else None,
            "other_tenant": other.tenant if other and other_lcp >= hit else None,
            "other_request_id": other.request_id if other and other_lcp >= hit else None,
            "other_lcp": other_lcp,
        })
    details = {"tenants": tenants, "hit_requests": examined, "violations": violations,
               "undecidable": undecidable}
    if violations:
        v = violations[0]
        if v["other_request_id"]:
            src = (f"only tenant {_name(v['other_tenant'])}'s req {v['other_request_id']} shares that prefix "
                   f"({v['other_lcp']} tokens)")
        else:
            src = "no request in the history shares that prefix (phantom hit or stale cache)"
        more = f" (and {len(violations) - 1} more)" if len(violations) > 1 else ""
        return CheckResult(
            name=NAME, verdict="failed",
            summary=(f"req {v['request_id']} (tenant {_name(v['tenant'])}) reused {v['hit_tokens']} cached tokens "
                     f"but its tenant's longest common prefix is {v['same_tenant_lcp']}: {src}{more}"),
            details=details)
    if not done:
        return CheckResult(name=NAME, verdict="unknown", summary="no request completed", details=details)
    if undecidable:
        return CheckResult(name=NAME, verdict="unknown",
                           summary=(f"{len(undecidable)} requests with cache hits have no prompt token ids "
                                    f"in the history (first: {undecidable[0]})"),
                           details=details)
    return CheckResult(name=NAME, verdict="passed",
                       summary=(f"{examined} requests with cache hits across {len(tenants)} tenant(s); "
                                f"every hit is covered by the same tenant's earlier prefix"),
                       details=details)
