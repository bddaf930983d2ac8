"""Settings of each check, as written under ``checks:`` in a scenario.

A check whose key is absent is not run. The check functions are the other modules of this
package; these models are only what the user may configure (the scenario model, chaos/scenario,
reads them under ``checks:``).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from chaos.duration import PositiveDuration
from chaos.workload.classify import REQUEST_CLASSES

__all__ = [
    "RecomputeEquivalenceConfig",
    "LivenessConfig",
    "PhaseDeadline",
    "AllowedFailure",
    "LeakSourceConfig",
    "LeaksConfig",
    "Within",
    "EvidenceConfig",
    "IsolationConfig",
    "HitRecoveryConfig",
    "HitQualityConfig",
    "PercentileBounds",
    "HitSpeedupConfig",
    "SloConfig",
    "ChecksConfig",
]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class RecomputeEquivalenceConfig(_Strict):
    """Every completed request's token ids equal the recompute twin's for the same prompt
    (``mode: exact``), or differ only by numerical noise (``mode: tolerant``, for engines that
    are not bit-exact)."""

    mode: Literal["exact", "tolerant"] = Field(
        default="exact",
        description="exact: token ids must be equal (bit-exact engines: the reference engine, vLLM "
        "with VLLM_BATCH_INVARIANT=1); tolerant: a difference is benign only at a near-tie (the margin "
        "rule) and hits may not diverge more often than the twin does against itself")
    margin_nats: float = Field(
        default=0.1, gt=0.0, le=5.0,
        description="tolerant: a divergence is benign only when the twin's top-1/top-2 logprob gap at "
        "the first differing token is at most this many nats and the engine produced the runner-up "
        "(LMCache's preemption correctness test uses 0.1)")
    alpha: float = Field(
        default=0.001, gt=0.0, lt=0.5,
        description="tolerant: significance level of the one-sided test that the hit path diverges "
        "more often than the noise floor (Fisher's exact test); smaller = fewer false failures")


class PhaseDeadline(_Strict):
    """A phase whose requests get their own liveness deadline (a recovery phase that must be
    fast, a fault phase whose requests wait on a held link)."""

    phase: str = Field(min_length=1, description="a phase of the scenario")
    request_deadline_s: PositiveDuration = Field(
        description="a request of this phase must end within this many seconds (number or 30s, 1m); "
        "the client gives up on it then")


class AllowedFailure(_Strict):
    """Requests that may end in an error without counting against ``allow_failed_fraction``:
    those matching every field given (at least one). E.g. the requests in flight while a
    ``retrieve_fail`` fault was in place under ``kv_load_failure_policy: fail``, whose error is
    the point of the scenario, while any other request's error still fails liveness."""

    phase: str | None = Field(default=None, min_length=1, description="the request was sent in this phase")
    fault: str | None = Field(default=None, min_length=1,
                              description="the fault (its name) was in place at some moment of the request's life")
    error_matches: str | None = Field(
        default=None, min_length=1,
        description="regular expression searched in the request's error text (e.g. the engine's HTTP 500 body)")
    at_most: int | None = Field(default=None, ge=1,
                                description="at most this many requests may fail this way; more fail liveness")

    @field_validator("error_matches")
    @classmethod
    def _regex(cls, v: str | None) -> str | None:
        if v is not None:
            import re

            try:
                re.compile(v)
            except re.error as exc:
                raise ValueError(f"not a regular expression: {exc}") from None
        return v

    @model_validator(mode="after")
    def _some(self) -> AllowedFailure:
        if self.phase is None and self.fault is None and self.error_matches is None:
            raise ValueError("give at least one of phase, fault, error_matches (which requests may fail)")
        return self


class LivenessConfig(_Strict):
    """Every request ends (output or a clear error) within a deadline; no process dies unless a
    fault killed it."""

    request_deadline_s: PositiveDuration = Field(
        default=60.0, description="a request must end within this many seconds (number or 30s, 1m)"
    )
    phase_deadlines: list[PhaseDeadline] = Field(
        default_factory=list, description="phases whose requests have their own deadline instead of "
        "request_deadline_s")
    allow_failed_fraction: float = Field(
        default=0.0, ge=0.0, le=1.0, description="fraction 0..1 of the requests not named by "
        "allowed_failures that may end in an error"
    )
    allowed_failures: list[AllowedFailure] = Field(
        default_factory=list, description="which requests may end in an error (by phase, fault in "
        "place, error text); they do not count against allow_failed_fraction")

    @model_validator(mode="after")
    def _one_deadline_per_phase(self) -> LivenessConfig:
        seen = [d.phase for d in self.phase_deadlines]
        twice = sorted({p for p in seen if seen.count(p) > 1})
        if twice:
            raise ValueError(f"phase_deadlines names phase(s) {', '.join(twice)} more than once")
        return self

    def deadline_for(self, phase: str | None) -> float:
        """The deadline (s) of a request sent in ``phase``: its ``phase_deadlines`` entry, else
        ``request_deadline_s``."""
        return next((d.request_deadline_s for d in self.phase_deadlines if d.phase == phase),
                    self.request_deadline_s)


class LeakSourceConfig(_Strict):
    """An HTTP endpoint whose numbers must return to their baseline when the stack is quiet."""

    name: str = Field(min_length=1, description="name of the source in the report")
    url: str = Field(min_length=1, description="URL returning JSON (or Prometheus text: format)")
    format: Literal["json", "prometheus"] = Field(
        default="json", description="json: fields are dotted paths; prometheus: fields are series "
        "selectors, metric or metric{label=\"v\",other=~\"re\"} (matching series summed)")
    baseline: Literal["zero", "before_faults"] = Field(
        default="zero", description="zero: every field must read 0; before_faults: every field must "
        "come back to at most what it read when the run started")
    fields: dict[str, str] = Field(
        min_length=1, description="reported name -> dotted path of a number in the JSON, or a "
        "Prometheus selector"
    )

    @model_validator(mode="after")
    def _selectors(self) -> LeakSourceConfig:
        if self.format == "prometheus":
            from chaos.prometheus import check_selectors

            check_selectors(self.fields)
        return self


class Within(_Strict):
    """A timing premise of the scenario's window: a moment of the run comes at most ``s``
    seconds after the start of ``phase``.

    A window that rests on a timeout or a TTL of the system under test (LMCache's L1 read-lock
    TTL, ``--l1-read-ttl-seconds``, and its session TTL, ``--session-ttl-seconds``; an engine's
    lookup deadline) is reached only if the run kept to its clock; on a loaded host the phases
    stretch, the TTL expires as designed, and the run would pass without having tested anything.
    With the premise stated, a run that broke it is inconclusive (exit 4), never passed.
    Used as a phase's ``ends_within`` and as ``checks.leaks.back_within``.
    """

    s: PositiveDuration = Field(description="seconds (number or 18s, 1m): keep it below the TTL or timeout the "
                                "window rests on, with a margin")
    phase: str | None = Field(default=None, min_length=1,
                              description="the phase whose start the time counts from; default: the phase itself "
                              "(ends_within), the first phase (back_within)")


class LeaksConfig(_Strict):
    """Locks, pins, sessions and staging bytes return to zero once the stack is quiet."""

    quiesce_s: PositiveDuration = Field(
        default=15.0, description="how long the counters may take to reach 0 after the last request"
    )
    poll_interval_s: PositiveDuration = Field(
        default=0.5, description="how often to read the leak sources while waiting"
    )
    sources: list[LeakSourceConfig] | None = Field(
        default=None, description="leak sources; omitted = the stack's x-kvchaos leak_sources"
    )
    back_within: Within | None = Field(
        default=None,
        description="a pass counts only when every source was back at its baseline at most `s` seconds after "
        "the start of `phase` (default the first phase); later, the run is inconclusive: a TTL (e.g. LMCache's "
        "L1 read-lock TTL) may have freed what the scenario should have seen held. A failure is not affected",
    )


class EvidenceConfig(_Strict):
    """Every fault bit (e.g. its toxic acted on a connection); otherwise the run is inconclusive."""


class IsolationConfig(_Strict):
    """No KV reuse across tenants (cache_salt): each tenant's output equals its own recompute
    and no request is served a hit that another tenant stored."""


class HitRecoveryConfig(_Strict):
    """After the faults heal, requests hit LMCache again (a client that never reconnects after
    a cache server restart serves correct output with a hit rate stuck at zero: F11)."""

    phases: list[str] = Field(min_length=1, description="phases (after the fault healed) whose requests are measured")
    min_request_hit_rate: float = Field(
        default=0.5, ge=0.0, le=1.0,
        description="fraction 0..1 of those completed requests that must get tokens from LMCache")


class HitQualityConfig(_Strict):
    """How much LMCache served, per phase: minimum token and request hit rates, full hits of
    re-sent stored prefixes, and the share of hits whose output equals recompute (definitions:
    chaos/checks/hits.py)."""

    phases: list[str] = Field(min_length=1, description="phases whose completed requests are measured, "
                              "each phase on its own")
    min_token_hit_rate: float | None = Field(
        default=None, ge=0.0, le=1.0,
        description="minimum LMCache token hit rate 0..1: tokens served from LMCache / prompt tokens looked up "
        "(the engine's own prefix cache is not counted)")
    min_request_hit_rate: float | None = Field(
        default=None, ge=0.0, le=1.0,
        description="minimum any-hit request rate 0..1: requests with >= 1 token from LMCache / requests looked up")
    min_full_hit_rate: float | None = Field(
        default=None, ge=0.0, le=1.0,
        description="minimum full-hit request rate 0..1: requests served all but the last prompt token "
        "(class lmcache_hit_full) / requests looked up")
    stored_prefix_full_hit: bool = Field(
        default=False,
        description="every request that re-sends a prefix stored earlier (the full chunks of an earlier "
        "completed prompt of the same tenant) recomputes none of it")
    stored_phases: list[str] | None = Field(
        default=None, description="phases whose prompts count as stored (default: every phase)")
    min_correct_hit_rate: float | None = Field(
        default=None, ge=0.0, le=1.0,
        description="minimum share 0..1 of LMCache hits whose output equals recompute (needs "
        "recompute_equivalence); default: reported, not bounded")
    min_requests: int = Field(
        default=4, ge=1,
        description="a phase with fewer completed requests looked up in LMCache is inconclusive (unknown)")

    @model_validator(mode="after")
    def _some_bound(self) -> HitQualityConfig:
        if not (self.stored_prefix_full_hit or any(v is not None for v in (
                self.min_token_hit_rate, self.min_request_hit_rate, self.min_full_hit_rate,
                self.min_correct_hit_rate))):
            raise ValueError("set at least one of min_token_hit_rate, min_request_hit_rate, min_full_hit_rate, "
                             "min_correct_hit_rate, stored_prefix_full_hit: a check with no bound cannot fail")
        return self

    def phase_refs(self) -> list[str]:
        """Phase names this check refers to (validated against the scenario's phases)."""
        return [*self.phases, *(self.stored_phases or [])]


#: Request classes an SLO bound may name, plus ``any`` (every completed request).
SLO_CLASSES = ("any", *REQUEST_CLASSES)


class PercentileBounds(_Strict):
    """Upper bounds of nearest-rank percentiles, in seconds (number or 500ms, 2s)."""

    p50: PositiveDuration | None = Field(default=None, description="bound of the median, seconds")
    p90: PositiveDuration | None = Field(default=None, description="bound of the 90th percentile, seconds")
    p99: PositiveDuration | None = Field(default=None, description="bound of the 99th percentile, seconds")
    max: PositiveDuration | None = Field(default=None, description="bound of the slowest sample, seconds")

    def items(self) -> list[tuple[str, float]]:
        """(percentile name, bound s) of the bounds that are set."""
        return [(k, v) for k in ("p50", "p90", "p99", "max") if (v := getattr(self, k)) is not None]


class HitSpeedupConfig(_Strict):
    """LMCache hits must be faster to first token than cold requests of the same prompt length."""

    min_ratio: float = Field(
        default=1.0, gt=0.0,
        description="median cold TTFT / median hit TTFT at the same prompt length must reach this (1: any "
        "speedup; a hit no faster than recompute fails)")
    min_hit_share: float = Field(
        default=0.5, gt=0.0, le=1.0,
        description="only hits that served at least this share 0..1 of the prompt from LMCache are compared")
    min_samples: int = Field(
        default=3, ge=1, description="streamed samples needed on each side (cold, hit) of a prompt length")
    baseline_phases: list[str] | None = Field(
        default=None, description="phases whose cold misses are the baseline (default: every phase); cold "
        "requests that overlapped a fault are never used")

    def phase_refs(self) -> list[str]:
        """Phase names this setting refers to."""
        return list(self.baseline_phases or [])


class SloConfig(_Strict):
    """Service-level bounds per request class: TTFT and latency percentiles, lookup timeouts per
    request, and hit TTFT against cold TTFT (a hit that brings no speedup is flagged)."""

    phases: list[str] | None = Field(default=None, description="phases whose requests are measured "
                                     "(default: every phase)")
    ttft: dict[str, PercentileBounds] = Field(
        default_factory=dict,
        description="request class (or any) -> TTFT percentile bounds; TTFT is measured on streamed requests "
        "only (workload.stream), from sending to the first token event")
    latency: dict[str, PercentileBounds] = Field(
        default_factory=dict, description="request class (or any) -> end-to-end latency percentile bounds")
    min_samples: int = Field(
        default=5, ge=1, description="samples a class needs for its percentile bounds; fewer: unknown")
    max_lookup_timeout_rate: float | None = Field(
        default=None, ge=0.0, le=1.0,
        description="bound 0..1 on completed requests whose LMCache lookup timed out (lookup: timeout; one "
        "per request) / completed requests looked up")
    hit_speedup: HitSpeedupConfig | None = Field(
        default=None, description="hits must bring a TTFT speedup over cold requests of the same length")

    @field_validator("ttft", "latency")
    @classmethod
    def _known_classes(cls, v: dict[str, PercentileBounds]) -> dict[str, PercentileBounds]:
        unknown = [k for k in v if k not in SLO_CLASSES]
        if unknown:
            raise ValueError(f"unknown request class(es) {unknown}; expected any of {', '.join(SLO_CLASSES)}")
        return v

    @model_validator(mode="after")
    def _some_bound(self) -> SloConfig:
        if not (any(b.items() for b in (*self.ttft.values(), *self.latency.values()))
                or self.max_lookup_timeout_rate is not None or self.hit_speedup is not None):
            raise ValueError("set at least one bound (ttft, latency, max_lookup_timeout_rate, hit_speedup): "
                             "a check with no bound cannot fail")
        return self

    def phase_refs(self) -> list[str]:
        """Phase names this check refers to."""
        return [*(self.phases or []), *(self.hit_speedup.phase_refs() if self.hit_speedup else [])]


class ChecksConfig(_Strict):
    """Which checks run (a key present = the check runs) and their settings."""

    recompute_equivalence: RecomputeEquivalenceConfig | None = Field(
        default=None, description="outputs equal the cache-off recompute twin's"
    )
    liveness: LivenessConfig | None = Field(default=None, description="requests end in time")
    leaks: LeaksConfig | None = Field(default=None, description="no leaked locks/pins/sessions")
    evidence: EvidenceConfig | None = Field(default=None, description="each fault really bit")
    isolation: IsolationConfig | None = Field(default=None, description="no cross-tenant KV reuse")
    hit_recovery: HitRecoveryConfig | None = Field(
        default=None, description="LMCache hits come back after the faults heal")
    hit_quality: HitQualityConfig | None = Field(
        default=None, description="per-phase token/request hit rates, full hits of stored prefixes, correct-hit rate")
    slo: SloConfig | None = Field(
        default=None, description="TTFT/latency percentiles per request class, lookup timeouts, hit speedup")

    @model_validator(mode="before")
    @classmethod
    def _empty_key_means_defaults(cls, data: object) -> object:
        # `leaks:` with nothing after it is YAML null; the user means "run it with defaults".
        if isinstance(data, dict):
            return {k: ({} if v is None else v) for k, v in data.items()}
        return data

    @model_validator(mode="after")
    def _at_least_one(self) -> ChecksConfig:
        if not self.enabled():
            raise ValueError(
                "enable at least one check (recompute_equivalence, liveness, leaks, evidence, "
                "isolation): a scenario that checks nothing cannot fail"
            )
        return self

    def enabled(self) -> list[str]:
        """Names of the checks to run, in the order above."""
        return [name for name in type(self).model_fields if getattr(self, name) is not None]
