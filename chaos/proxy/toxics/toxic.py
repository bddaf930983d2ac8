"""The toxic interface, the per-connection stub, and the registry of toxic types.

A toxic is something attached to a link that changes how data passes through it (adds
latency, caps the rate, cuts the stream). The shape follows Toxiproxy 2.x
(``toxics/toxic.go`` in Shopify/toxiproxy)::

                  Toxic (settings, shared by every connection of the proxy)
                    v
    Client <-> ToxicStub <-> ToxicStub <-> ... <-> Upstream
               (one per connection, per direction, per toxic: toxicity roll and state)

A toxic's settings are a pydantic model whose field names are the JSON names of the
``attributes`` object in Toxiproxy's API (units in each field's description). Behaviour lives
in three hooks that a toxic type overrides as needed:

- ``pipe(stub, chunk, emit)``: called for every chunk that reaches this stage; ``await
  emit(chunk)`` passes data to the next stage (or the socket). Not calling it drops data.
- ``on_eof(stub)``: the source half-closed; runs before the EOF travels on.
- ``start(stub)`` / ``cleanup(stub)``: the stub began to run (connection opened, toxic added or
  updated) / the toxic is being removed from a live connection.

A module registers its type with :func:`register`; the API looks types up with
:func:`toxic_type`. Adding a toxic type touches one new module and nothing else.
"""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Awaitable, Callable, ClassVar

from pydantic import BaseModel, ConfigDict, model_validator

if TYPE_CHECKING:
    from chaos.proxy.link import ToxicLink
    from chaos.proxy.toxic_collection import ToxicWrapper


@dataclass(slots=True)
class Chunk:
    """Bytes read from one socket, on their way through a link.

    ``timestamp`` is ``loop.time()`` (seconds) when the bytes were read; a latency toxic
    delays a chunk relative to it, so chunks queued behind a slow one do not pay twice.
    """

    data: bytes | memoryview
    timestamp: float


Emit = Callable[[Chunk], Awaitable[None]]

#: Bounds of Go's int64, the type of every integer toxic attribute in Toxiproxy.
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


class Toxic(BaseModel):
    """Settings of one toxic type (the API's ``attributes``) plus its behaviour hooks.

    Attribute validation is strict, like Go's ``encoding/json`` decoding into ``int64``: a
    string or a fractional number for an integer attribute is rejected (HTTP 400). Unknown
    attribute names are ignored, as Toxiproxy ignores them.
    """

    model_config = ConfigDict(strict=True, extra="ignore", frozen=True)

    @model_validator(mode="after")
    def _int64(self) -> "Toxic":
        # Go decodes every integer attribute into an int64: a value outside it is a 400 there.
        for name, value in self:
            if isinstance(value, int) and not isinstance(value, bool) and not INT64_MIN <= value <= INT64_MAX:
                raise ValueError(f"{name}: {value} does not fit in an int64")
        return self

    type_name: ClassVar[str] = ""
    # True: every chunk through an active stub counts as the toxic acting on the connection
    # (latency, bandwidth, slicer...). False: the toxic calls ``stub.mark_acted()`` itself
    # (limit_data only acts when it cuts the stream).
    acts_on_every_chunk: ClassVar[bool] = True

    def new_state(self) -> Any:
        """Return fresh per-connection state for a stub, or None for a stateless toxic."""
        return None

    def start(self, stub: ToxicStub) -> None:
        """Called when the stub starts running this toxic (link opened, toxic added/updated)."""

    async def pipe(self, stub: ToxicStub, chunk: Chunk, emit: Emit) -> None:
        """Move one chunk through this stage; the default passes it on unchanged."""
        await emit(chunk)

    async def on_eof(self, stub: ToxicStub) -> None:
        """The source sent EOF (FIN); called once, after every chunk before it went through."""

    def cleanup(self, stub: ToxicStub) -> None:
        """Called on a live connection when the toxic is removed (Toxiproxy's CleanupToxic)."""


_REGISTRY: dict[str, type[Toxic]] = {}


def register(cls: type[Toxic]) -> type[Toxic]:
    """Class decorator: register a toxic type under ``cls.type_name`` (the API's ``type``).

    Raises:
        ValueError: the class has no ``type_name`` or the name is taken by another class.
    """
    name = cls.type_name
    if not name:
        raise ValueError(f"{cls.__name__} has no type_name")
    if name in _REGISTRY and _REGISTRY[name] is not cls:
        raise ValueError(f"toxic type {name!r} registered twice")
    _REGISTRY[name] = cls
    return cls


def toxic_type(name: str) -> type[Toxic] | None:
    """Return the toxic class registered under ``name``, or None if there is none."""
    return _REGISTRY.get(name)


def toxic_types() -> list[str]:
    """Return the registered toxic type names, sorted."""
    return sorted(_REGISTRY)


class ToxicStub:
    """One toxic running on one direction of one connection.

    Holds the toxicity roll (``active``: the toxic acts on this connection; otherwise the
    stage passes data through untouched, like Toxiproxy's noop), the toxic's per-connection
    ``state``, and an interruptible sleep so that removing or updating the toxic releases a
    held chunk at once instead of dropping it.
    """

    __slots__ = ("wrapper", "link", "active", "state", "removed", "acted", "_sleeper", "_timer")

    def __init__(self, wrapper: ToxicWrapper, link: ToxicLink, rng: random.Random) -> None:
        self.wrapper = wrapper
        self.link = link
        self.state: Any = wrapper.toxic.new_state()
        self.removed = False
        self.acted = False
        self._sleeper: asyncio.Future[bool] | None = None
        self._timer: asyncio.TimerHandle | None = None
        self.active = False
        self.roll(rng)

    @property
    def toxic(self) -> Toxic:
        """The toxic's current settings (an update replaces them on the wrapper)."""
        return self.wrapper.toxic

    def roll(self, rng: random.Random) -> None:
        """Draw whether the toxic acts on this connection: P(active) = toxicity."""
        self.active = rng.random() < self.wrapper.toxicity

    def mark_acted(self) -> None:
        """Record, once per stub, that the toxic acted on this connection (for /metrics)."""
        if not self.acted:
            self.acted = True
            self.link.stats.toxic_acted(self.wrapper)

    async def sleep(self, seconds: float) -> bool:
        """Sleep ``seconds``; return True if the time passed, False if interrupted early."""
        if self.removed:
            return False  # removed while its pipe was busy elsewhere: no more waiting
        if seconds <= 0:
            return True
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[bool] = loop.create_future()
        self._sleeper = fut
        handle = loop.call_later(seconds, _resolve, fut, True)
        try:
            return await fut
        finally:
            handle.cancel()
            self._sleeper = None

    def call_later(self, seconds: float, callback: Callable[[], None]) -> None:
        """Run ``callback`` after ``seconds`` unless the stub is interrupted first."""
        self.cancel_timer()
        self._timer = asyncio.get_running_loop().call_later(seconds, callback)

    def cancel_timer(self) -> None:
        """Cancel the pending :meth:`call_later` callback, if any."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def interrupt(self) -> None:
        """Wake a sleeping ``pipe`` (it then passes on what it holds) and cancel timers."""
        self.cancel_timer()
        if self._sleeper is not None:
            _resolve(self._sleeper, False)


def _resolve(fut: asyncio.Future[bool], value: bool) -> None:
    if not fut.done():
        fut.set_result(value)
