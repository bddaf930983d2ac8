"""WorkloadSpec: the ``workload:`` section of a scenario (what requests to send).

Lengths are in tokens; the reference engine's tokenizer is byte-level, so the generator sends
token ids (0..255) and a length is exact.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, StrictInt, field_validator

__all__ = ["WorkloadSpec"]


class WorkloadSpec(BaseModel):
    """Requests of a phase that runs the workload.

    A request's prompt = its family's shared prefix + a distinct suffix. With ``turns`` > 1,
    requests form conversations: turn k's prompt = turn k-1's prompt + its output + a new
    ``suffix_tokens`` user text; the turns of one conversation run in order.
    """

    model_config = ConfigDict(extra="forbid")

    families: StrictInt = Field(default=4, ge=1, le=10_000, description="number of shared-prefix families")
    prefix_tokens: list[StrictInt] | StrictInt = Field(
        default_factory=lambda: [256],
        description="shared prefix length per family in tokens, cycled over families (one value or a list)",
    )
    suffix_tokens: StrictInt = Field(
        default=32, ge=0, le=1_000_000, description="distinct suffix per request (and new user text per turn), tokens"
    )
    turns: StrictInt = Field(default=1, ge=1, le=1000, description="turns per conversation; >1 makes multi-turn conversations that grow")
    tenants: StrictInt | list[str] = Field(
        default=1,
        description="number of tenants (cache_salt values tenant-0..N-1) or the list of salts; "
        "1 sends no cache_salt",
    )
    requests: StrictInt = Field(default=24, ge=0, le=1_000_000, description="requests per phase that runs the workload")
    concurrency: StrictInt = Field(default=4, ge=1, le=10_000, description="requests in flight at once")
    max_tokens: StrictInt = Field(default=16, ge=1, le=100_000, description="tokens generated per request")
    stream: bool | float = Field(
        default=False,
        description="stream responses (SSE): true, false, or the fraction 0..1 of requests streamed",
    )

    @field_validator("prefix_tokens")
    @classmethod
    def _prefixes(cls, v: list[int] | int) -> list[int]:
        values = [v] if isinstance(v, int) else list(v)
        if not values:
            raise ValueError("give at least one prefix length")
        for n in values:
            if n < 0 or n > 1_000_000:
                raise ValueError(f"prefix lengths must be 0..1000000 tokens (got {n})")
        return values

    @field_validator("tenants")
    @classmethod
    def _tenants(cls, v: int | list[str]) -> int | list[str]:
        if isinstance(v, int):
            if not 1 <= v <= 10_000:
                raise ValueError(f"tenants must be 1..10000 (got {v})")
        else:
            if not v:
                raise ValueError("give at least one cache_salt")
            if len(set(v)) != len(v):
                raise ValueError("cache_salt values must be distinct")
        return v

    @field_validator("stream")
    @classmethod
    def _stream(cls, v: bool | float) -> bool | float:
        if not isinstance(v, bool) and not 0.0 <= v <= 1.0:
            raise ValueError(f"stream fraction must be within 0..1 (got {v})")
        return v

    @property
    def prefix_lengths(self) -> list[int]:
        """Prefix length (tokens) of each family, the list cycled to ``families`` entries."""
        values = self.prefix_tokens if isinstance(self.prefix_tokens, list) else [self.prefix_tokens]
        return [values[i % len(values)] for i in range(self.families)]

    @property
    def salts(self) -> list[str | None]:
        """cache_salt per tenant; ``[None]`` for a single tenant given as a count."""
        if isinstance(self.tenants, list):
            return list(self.tenants)
        if self.tenants == 1:
            return [None]
        return [f"tenant-{i}" for i in range(self.tenants)]

    @property
    def stream_fraction(self) -> float:
        """Fraction of requests streamed, 0..1."""
        return float(self.stream) if not isinstance(self.stream, bool) else (1.0 if self.stream else 0.0)
