"""latency: delay data on a link by ``latency_ms`` (± ``jitter_ms``), Toxiproxy `latency`."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, StrictInt, model_validator

from chaos.faults.network import ToxicFault, ToxicParams
from chaos.faults.registry import register


class LatencyParams(ToxicParams):
    kind: Literal["latency"]
    latency_ms: StrictInt = Field(ge=0, description="added delay per chunk of data, milliseconds")
    jitter_ms: StrictInt = Field(default=0, ge=0, description="random ± variation of the delay, milliseconds")

    @model_validator(mode="after")
    def _delays_something(self) -> LatencyParams:
        if self.latency_ms == 0 and self.jitter_ms == 0:
            raise ValueError("latency_ms 0 with no jitter_ms delays nothing: the fault could only ever "
                             "\"bite\" without any effect (give latency_ms > 0)")
        return self


@register("latency")
class Latency(ToxicFault):
    """Every chunk on the link waits ``latency_ms`` ± ``jitter_ms`` before it is passed on."""

    params_model = LatencyParams
    toxic_type = "latency"

    def attributes(self) -> dict[str, int]:
        return {"latency": self.params.latency_ms, "jitter": self.params.jitter_ms}
