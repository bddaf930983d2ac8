"""The toxics of one proxy: a chain per direction, applied to every open link.

New toxics go to the end of their direction's chain (Toxiproxy's ``toxic_collection.go``).
Every change is pushed to the links already open, so a fault starts, changes or heals on
live connections, not only on new ones.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from chaos.proxy import errors
from chaos.proxy.models import ToxicCreate, ToxicInfo, ToxicUpdate
from chaos.proxy.toxics import Toxic, toxic_type


if TYPE_CHECKING:
    from chaos.proxy.link import ToxicLink
    from chaos.proxy.metrics import ProxyStats

STREAMS = ("upstream", "downstream")


@dataclass(eq=False)
class ToxicWrapper:
    """A toxic as configured on a proxy: name, type, stream, toxicity and settings."""

    name: str
    type: str
    stream: str
    toxicity: float
    toxic: Toxic
    #: Resets of ``reset_peer`` whose delay has started (they complete even after removal).
    pending: set[asyncio.Future[None]] = field(default_factory=set)

    def info(self) -> ToxicInfo:
        """Return the API view of the toxic."""
        return ToxicInfo(attributes=self.toxic.model_dump(), name=self.name, type=self.type,
                         stream=self.stream, toxicity=self.toxicity)  # type: ignore[arg-type]


def _toxicity(value: float) -> float:
    if not 0.0 <= value <= 1.0:
        raise errors.BAD_REQUEST_BODY.joined(f"toxicity {value} is not between 0 and 1")
    return value


def _settings(cls: type[Toxic], attributes: dict[str, Any]) -> Toxic:
    try:
        return cls.model_validate(attributes)
    except ValidationError as exc:
        raise errors.BAD_REQUEST_BODY.joined(f"attributes of {cls.type_name}: {errors.describe(exc)}")


class ToxicCollection:
    """Toxic chains of one proxy plus the set of its open links."""

    def __init__(self, stats: ProxyStats) -> None:
        self.stats = stats
        self._chains: dict[str, list[ToxicWrapper]] = {s: [] for s in STREAMS}
        self.links: set[ToxicLink] = set()

    def chain(self, stream: str) -> list[ToxicWrapper]:
        """Return a copy of the chain of ``stream`` ("upstream" or "downstream"), in order."""
        return list(self._chains[stream])

    def all(self) -> list[ToxicWrapper]:
        """Return every toxic: the upstream chain, then the downstream chain (as Toxiproxy)."""
        return self._chains["upstream"] + self._chains["downstream"]

    def get(self, name: str) -> ToxicWrapper:
        """Return the toxic called ``name``.

        Raises:
            ApiError: 404 "toxic not found".
        """
        for wrapper in self.all():
            if wrapper.name == name:
                return wrapper
        raise errors.TOXIC_NOT_FOUND

    def add(self, spec: ToxicCreate) -> ToxicWrapper:
        """Add a toxic at the end of its stream's chain, on open links too.

        Raises:
            ApiError: 400 bad stream, unknown type, bad attributes or toxicity;
                409 a toxic of that name exists.
        """
        if spec.stream not in STREAMS:
            raise errors.INVALID_STREAM
        name = spec.name or f"{spec.type}_{spec.stream}"
        cls = toxic_type(spec.type)
        if cls is None:
            raise errors.INVALID_TOXIC_TYPE.joined(repr(spec.type)) if spec.type else \
                errors.INVALID_TOXIC_TYPE
        if any(w.name == name for w in self.all()):
            raise errors.TOXIC_ALREADY_EXISTS
        wrapper = ToxicWrapper(name=name, type=spec.type, stream=spec.stream,
                               toxicity=_toxicity(spec.toxicity),
                               toxic=_settings(cls, spec.attributes))
        self._chains[spec.stream].append(wrapper)
        self.stats.toxic_added(wrapper)
        for link in list(self.links):
            if link.direction == wrapper.stream and not link.closed:
                link.add_stub(wrapper)
        return wrapper

    def update(self, name: str, spec: ToxicUpdate) -> ToxicWrapper:
        """Merge new attributes/toxicity into toxic ``name``; live stubs restart with them.

        Raises:
            ApiError: 404 no such toxic; 400 bad attributes or toxicity.
        """
        wrapper = self.get(name)
        merged = {**wrapper.toxic.model_dump(), **spec.attributes}
        toxic = _settings(type(wrapper.toxic), merged)
        toxicity = _toxicity(spec.toxicity) if spec.toxicity is not None else wrapper.toxicity
        wrapper.toxic, wrapper.toxicity = toxic, toxicity
        for link in list(self.links):
            if link.direction == wrapper.stream:
                link.update_stub(wrapper)
        return wrapper

    def remove(self, name: str) -> list[asyncio.Future[None]]:
        """Remove toxic ``name`` from its chain and from every open link.

        Returns:
            The toxic's actions already under way that still complete (``reset_peer`` resets
            whose delay started): the API answers once they are done, as Toxiproxy does.

        Raises:
            ApiError: 404 no such toxic.
        """
        wrapper = self.get(name)
        self._chains[wrapper.stream].remove(wrapper)
        for link in list(self.links):
            if link.direction == wrapper.stream:
                link.remove_stub(wrapper)
        return list(wrapper.pending)

    def reset(self) -> list[asyncio.Future[None]]:
        """Remove every toxic (``POST /reset``); returns what still completes (:meth:`remove`)."""
        pending: list[asyncio.Future[None]] = []
        for wrapper in self.all():
            pending += self.remove(wrapper.name)
        return pending
