"""Settings of each check, as written under ``checks:`` in a scenario.

A check whose key is absent is not run. The check functions themselves live in chaos/checks;
these models are only what the user may configure.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from chaos.scenario.duration import PositiveDuration

__all__ = [
    "RecomputeEquivalenceConfig",
    "LivenessConfig",
    "LeakSourceConfig",
    "LeaksConfig",
    "EvidenceConfig",
    "IsolationConfig",
    "HitRecoveryConfig",
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


class LivenessConfig(_Strict):
    """Every request ends (output or a clear error) within a deadline; no process dies unless a
    fault killed it."""

    request_deadline_s: PositiveDuration = Field(
        default=60.0, description="a request must end within this many seconds (number or 30s, 1m)"
    )
    allow_failed_fraction: float = Field(
        default=0.0, ge=0.0, le=1.0, description="fraction 0..1 of requests that may end in an error"
    )


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
