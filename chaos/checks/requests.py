"""Requests and faults as the checks see them: history ops paired up.

The history (docs/architecture.md section 3) is a flat list of ops. A client request is an
`invoke` op (f="complete") followed by at most one completion op (`ok`, `fail` or `info`) with
the same request_id; a fault is the nemesis' `apply` then `heal` ops with the same fault_id.
Every check and the stats read the pairs built here, so the pairing rules live in one place:

    history ──> ops (dicts) ──> RequestRecord (invoke + completion)
                           └──> FaultRecord   (apply + heal, with evidence)

Value fields read (all optional; absent means "not observed"):
- invoke `value`: `prompt_token_ids` (or `prompt` as a token list), `cache_salt` / `tenant`,
  `max_tokens`, `stream`, `family`.
- ok `value`: `token_ids`, `prompt_len`, `finish_reason`, `cached_token_stats` (or
  `kv_transfer_params.cached_token_stats`), `usage`, `ttft_s`, `itl_s` (list of inter-token
  gaps, s), `latency_s` (chaos.workload.client.CompletionOutcome).
- fail/info `value`: `error`, `aborted` (True when the client aborted on purpose), `reason`.
- nemesis apply `value`: `kind`, `params` / the fault's settings, `target`/`link`.
- nemesis heal `value`: `evidence` = `{"bit": bool, ...}` (or the evidence keys inline).
"""

from __future__ import annotations

from typing import Any, Iterable, Literal

from pydantic import BaseModel, Field

from chaos.history import Op
from chaos.workload.classify import RequestClass, classify_value, normalize_cache_stats

OpType = Literal["invoke", "ok", "fail", "info"]


def op_dicts(history: Iterable[Op | dict[str, Any]]) -> list[dict[str, Any]]:
    """Turn history ops (pydantic `Op` models or plain dicts from history.jsonl) into dicts.

    Args:
        history: ops in any order; each a mapping or a pydantic model with the section-3 keys.
    Returns:
        dicts sorted by (time, index), `value` always a dict.
    Raises:
        TypeError: an element is neither a mapping nor a pydantic model.
    """
    out: list[dict[str, Any]] = []
    for op in history:
        if isinstance(op, dict):
            d = dict(op)
        elif hasattr(op, "model_dump"):
            d = op.model_dump()
        else:
            raise TypeError(f"history op must be a dict or a pydantic model, got {type(op).__name__}")
        d["value"] = d.get("value") or {}
        out.append(d)
    out.sort(key=lambda d: (float(d.get("time") or 0.0), int(d.get("index") or 0)))
    return out


class CachedTokenStats(BaseModel):
    """The engine's own account of cache reuse for one request (kv_transfer_params)."""

    local_cache_hit_tokens: int = 0
    external_cache_hit_tokens: int = 0
    lookup: str | None = None
    load_failed_tokens: int = 0
    num_preemptions: int = 0

    @property
    def hit_tokens(self) -> int:
        """Tokens not computed for the prompt: local (engine prefix cache) + external (LMCache)."""
        return self.local_cache_hit_tokens + self.external_cache_hit_tokens


class RequestRecord(BaseModel):
    """One client request: its invoke and its completion (None when it never completed).

    Times are s since run start. `outcome` is the completion op's type, None when missing.
    """

    request_id: str
    process: str = ""
    phase: str = ""
    invoke_time: float
    end_time: float | None = None
    outcome: Literal["ok", "fail", "info"] | None = None
    tenant: str | None = None
    prompt_token_ids: list[int] | None = None
    token_ids: list[int] | None = None
    finish_reason: str | None = None
    cached_token_stats: CachedTokenStats | None = None
    prompt_tokens: int | None = None
    ttft_s: float | None = None
    itl_s: list[float] = Field(default_factory=list)
    error: str | None = None
    aborted: bool = False
    request_class: RequestClass | None = None
    invoke_value: dict[str, Any] = Field(default_factory=dict)
    end_value: dict[str, Any] = Field(default_factory=dict)

    @property
    def latency_s(self) -> float | None:
        """End-to-end latency seen by the client (s), None if it never completed."""
        return None if self.end_time is None else self.end_time - self.invoke_time

    @property
    def hit_tokens(self) -> int:
        """local + external cache hit tokens (0 when the engine reported no stats)."""
        return self.cached_token_stats.hit_tokens if self.cached_token_stats else 0


def _tokens(v: Any) -> list[int] | None:
    if isinstance(v, list) and all(isinstance(t, int) for t in v):
        return list(v)
    return None


def _stats(value: dict[str, Any]) -> CachedTokenStats | None:
    raw = value.get("cached_token_stats")
    if raw is None:
        raw = (value.get("kv_transfer_params") or {}).get("cached_token_stats")
    return CachedTokenStats.model_validate(normalize_cache_stats(raw)) if isinstance(raw, dict) else None


def _tenant(value: dict[str, Any]) -> str | None:
    for key in ("tenant", "cache_salt"):
        if value.get(key) is not None:
            return str(value[key])
    return None


def requests(history: Iterable[Op | dict[str, Any]]) -> list[RequestRecord]:
    """Pair client invokes with their completions.

    Args:
        history: ops (dicts or `Op` models), any order.
    Returns:
        one RequestRecord per client invoke with f="complete", in invoke order. A completion
        whose request_id was never invoked is ignored (the history writer never produces one).
    """
    by_id: dict[str, RequestRecord] = {}
    order: list[str] = []
    for op in op_dicts(history):
        if op.get("process") == "nemesis" or op.get("f", "complete") != "complete":
            continue
        rid = op.get("request_id")
        if rid is None:
            continue
        rid = str(rid)
        value = op["value"]
        if op.get("type") == "invoke":
            prompt = _tokens(value.get("prompt_token_ids")) or _tokens(value.get("prompt"))
            by_id[rid] = RequestRecord(
                request_id=rid, process=str(op.get("process") or ""), phase=str(op.get("phase") or ""),
                invoke_time=float(op.get("time") or 0.0), tenant=_tenant(value),
                prompt_token_ids=prompt, invoke_value=value,
            )
            order.append(rid)
            continue
        rec = by_id.get(rid)
        if rec is None or rec.outcome is not None:
            continue
        rec.outcome = op["type"]
        rec.end_time = float(op.get("time") or 0.0)
        rec.end_value = value
        rec.token_ids = _tokens(value.get("token_ids"))
        rec.finish_reason = value.get("finish_reason")
        rec.cached_token_stats = _stats(value)
        if rec.prompt_token_ids is None:
            rec.prompt_token_ids = _tokens(value.get("prompt_token_ids"))
        usage = value.get("usage") or {}
        rec.prompt_tokens = usage.get("prompt_tokens") or value.get("prompt_len") or (
            len(rec.prompt_token_ids) if rec.prompt_token_ids is not None else None)
        rec.ttft_s = value.get("ttft_s")
        rec.itl_s = [float(x) for x in value.get("itl_s") or []]
        rec.error = value.get("error")
        rec.aborted = bool(value.get("aborted"))
        rec.request_class = classify_request(rec)
    return [by_id[r] for r in order]


def classify_request(rec: RequestRecord) -> RequestClass | None:
    """Class of a request (chaos.workload.classify's rules, on the paired record).

    cold_miss, local_hit, lmcache_hit_full, lmcache_hit_partial, lookup_timeout,
    load_failure_recompute, failed, aborted; None while the request has not completed. The
    prompt length for full vs partial hits comes from the completion's `prompt_len`, else the
    usage or the invoke's prompt token ids.
    """
    if rec.outcome is None:
        return None
    value = dict(rec.end_value)
    if rec.cached_token_stats is not None:
        # The stats may sit under kv_transfer_params (vLLM's shape); classify reads them here.
        value["cached_token_stats"] = rec.cached_token_stats.model_dump()
    if not value.get("prompt_len"):
        value["prompt_len"] = rec.prompt_tokens or 0
    return classify_value(rec.outcome, value)


class FaultRecord(BaseModel):
    """One nemesis fault: its apply and heal ops.

    Attributes:
        fault_id: id shared by the apply and heal ops.
        kind: fault kind (registry name = YAML `kind`), "" when not recorded.
        phase: phase it was applied in.
        applied_at / healed_at: s since run start of the apply completion (or invoke) and of the
            heal completion; None when that step never happened.
        apply_outcome / heal_outcome: "ok" | "fail" | "info" | None.
        params: the fault's settings as recorded at apply.
        evidence: the evidence dict recorded at heal ({"bit": bool, ...}); None when absent.
        trigger: what the fault's trigger saw ({"reached": bool, "conditions": [...]}, from
            chaos/probes.py); None when it declares no trigger (or was never healed).
        error: error text of a failed apply/heal.
    """

    fault_id: str
    kind: str = ""
    phase: str = ""
    applied_at: float | None = None
    healed_at: float | None = None
    apply_outcome: str | None = None
    heal_outcome: str | None = None
    params: dict[str, Any] = Field(default_factory=dict)
    evidence: dict[str, Any] | None = None
    trigger: dict[str, Any] | None = None
    #: The kind's default trigger the runner recorded at apply (``{"kind", "basis", "text"}``;
    #: chaos/faults/base.py DefaultTrigger) when the fault declares no ``trigger``.
    default_trigger: dict[str, Any] | None = None
    error: str | None = None

    @property
    def bit(self) -> bool:
        """True when the fault's evidence says it changed something observable."""
        return bool(self.evidence and self.evidence.get("bit") is True)


def phase_starts(history: Iterable[Op | dict[str, Any]]) -> dict[str, float]:
    """Phase name -> its start (s since run start), from the ``phase`` ops the runner writes as
    each phase begins (chaos/runner/run.py ``Nemesis.phase_started``)."""
    out: dict[str, float] = {}
    for op in op_dicts(history):
        if (op.get("process") == "nemesis" and op.get("f") == "phase"
                and (op.get("value") or {}).get("event") == "start"):
            out.setdefault(op.get("phase", ""), float(op.get("time") or 0.0))
    return out


def faults(history: Iterable[Op | dict[str, Any]]) -> list[FaultRecord]:
    """Pair nemesis apply and heal ops by fault_id.

    Args:
        history: ops (dicts or `Op` models), any order.
    Returns:
        one FaultRecord per fault_id seen on a nemesis op, in order of first appearance.
    """
    by_id: dict[str, FaultRecord] = {}
    for op in op_dicts(history):
        if op.get("process") != "nemesis" or op.get("fault_id") is None:
            continue
        fid = str(op["fault_id"])
        value = op["value"]
        rec = by_id.setdefault(fid, FaultRecord(fault_id=fid, phase=str(op.get("phase") or "")))
        rec.kind = rec.kind or str(value.get("kind") or "")
        if op.get("f") == "apply":
            if op.get("type") == "invoke":
                rec.applied_at = float(op.get("time") or 0.0)
                rec.params = dict(value.get("params") or {k: v for k, v in value.items() if k != "kind"})
                if isinstance(value.get("default_trigger"), dict):
                    rec.default_trigger = value["default_trigger"]
            else:
                rec.apply_outcome = op.get("type")
                if rec.applied_at is None or op.get("type") == "ok":
                    rec.applied_at = float(op.get("time") or 0.0)
                if op.get("type") == "fail":
                    rec.error = value.get("error")
        elif op.get("f") == "heal":
            if op.get("type") == "invoke":
                continue
            rec.heal_outcome = op.get("type")
            rec.healed_at = float(op.get("time") or 0.0)
            ev = value.get("evidence")
            if ev is None and "bit" in value:
                ev = {k: v for k, v in value.items() if k != "kind"}
            if isinstance(ev, dict):
                rec.evidence = ev
            if isinstance(value.get("trigger"), dict):
                rec.trigger = value["trigger"]
            if op.get("type") == "fail":
                rec.error = value.get("error") or rec.error
    return list(by_id.values())
