"""noop: passes data on unchanged (Toxiproxy 2.x ``toxics/noop.go``).

The real server accepts ``noop`` through its API (it is the toxic every link's chain starts
with); so does this one, so a client that adds one works against both. It never "acts".
"""

from __future__ import annotations

from chaos.proxy.toxics.toxic import Toxic, register


@register
class NoopToxic(Toxic):
    """Does nothing."""

    type_name = "noop"
    acts_on_every_chunk = False
