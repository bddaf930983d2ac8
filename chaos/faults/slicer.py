"""slicer: cut data into small pieces with a delay between them (partial reads/writes)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, StrictInt, model_validator

from chaos.faults.network import ToxicFault, ToxicParams
from chaos.faults.registry import register


class SlicerParams(ToxicParams):
    kind: Literal["slicer"]
    average_size: StrictInt = Field(ge=1, description="average piece size, bytes")
    size_variation: StrictInt = Field(
        default=0, ge=0, description="± variation of the piece size, bytes (< average_size)"
    )
    delay_us: StrictInt = Field(default=0, ge=0, description="pause between pieces, microseconds")

    @model_validator(mode="after")
    def _variation_below_average(self) -> SlicerParams:
        # The proxy rejects it (Toxiproxy itself would loop forever); say so at validation.
        if self.size_variation >= self.average_size:
            raise ValueError(
                f"size_variation must be smaller than average_size "
                f"(got {self.size_variation} >= {self.average_size})"
            )
        return self


@register("slicer")
class Slicer(ToxicFault):
    """Data arrives in ~``average_size``-byte pieces, ``delay_us`` apart."""

    params_model = SlicerParams
    toxic_type = "slicer"

    def attributes(self) -> dict[str, int]:
        return {
            "average_size": self.params.average_size,
            "size_variation": self.params.size_variation,
            "delay": self.params.delay_us,
        }
