"""bandwidth: cap a link's throughput at ``rate_kbps`` kilobytes per second."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, StrictInt

from chaos.faults.network import ToxicFault, ToxicParams
from chaos.faults.registry import register


class BandwidthParams(ToxicParams):
    kind: Literal["bandwidth"]
    # Toxiproxy's `rate` is KB/s (1 KB = 1000 bytes), not kilobits: the name keeps its unit.
    rate_kbps: StrictInt = Field(ge=1, description="throughput cap, kilobytes (1000 bytes) per second")


@register("bandwidth")
class Bandwidth(ToxicFault):
    """The chosen stream of the link trickles at ``rate_kbps`` KB/s."""

    params_model = BandwidthParams
    toxic_type = "bandwidth"

    def attributes(self) -> dict[str, int]:
        return {"rate": self.params.rate_kbps}
