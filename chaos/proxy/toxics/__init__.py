"""Toxic types, one module each, registered by their Toxiproxy type name on import.

See :mod:`chaos.proxy.toxics.toxic` for the interface and the pipeline picture.
"""

from chaos.proxy.toxics import (  # noqa: F401  (imported to register each type)
    bandwidth,
    latency,
    limit_data,
    noop,
    reset_peer,
    slicer,
    slow_close,
    timeout,
)
from chaos.proxy.toxics.toxic import Chunk, Toxic, ToxicStub, register, toxic_type, toxic_types

__all__ = ["Chunk", "Toxic", "ToxicStub", "register", "toxic_type", "toxic_types"]
