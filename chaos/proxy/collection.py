"""All proxies of a server, by name: create, populate, remove, reset (``proxy_collection.go``).

Each proxy gets its own toxicity RNG seeded from ``(seed, proxy name)``, so a seeded run draws
the same toxicity rolls per proxy whatever the other proxies do.
"""

from __future__ import annotations

import asyncio

import random

from chaos.proxy import errors
from chaos.proxy.metrics import ProxyStats
from chaos.proxy.models import ProxyCreate
from chaos.proxy.proxy import Proxy, split_address


class ProxyCollection:
    """The proxies of one server plus their (deletion-surviving) counters."""

    def __init__(self, seed: int | None = None, allow_remote: bool = False) -> None:
        self.proxies: dict[str, Proxy] = {}
        self.stats: dict[str, ProxyStats] = {}
        self.seed = seed
        self.allow_remote = allow_remote

    def _new(self, spec: ProxyCreate, where: str = "") -> Proxy:
        if not spec.name:
            raise errors.MISSING_FIELD.joined("name" + where)
        if not spec.upstream:
            raise errors.MISSING_FIELD.joined("upstream" + where)
        try:
            split_address(spec.upstream)
        except ValueError as exc:
            raise errors.BAD_REQUEST_BODY.joined(str(exc)) from None
        stats = self.stats.setdefault(spec.name, ProxyStats(spec.name))
        rng = random.Random(f"{self.seed}:{spec.name}") if self.seed is not None \
            else random.Random()
        return Proxy(spec.name, spec.listen, spec.upstream, stats, rng, self.allow_remote)

    def get(self, name: str) -> Proxy:
        """Return proxy ``name``.

        Raises:
            ApiError: 404 "proxy not found".
        """
        try:
            return self.proxies[name]
        except KeyError:
            raise errors.PROXY_NOT_FOUND from None

    async def add(self, spec: ProxyCreate) -> Proxy:
        """Create a proxy (``POST /proxies``), listening unless ``enabled`` is false.

        Raises:
            ApiError: 400 missing name/upstream or bad address; 409 the name exists;
                500 the listen address cannot be bound.
        """
        if spec.name and spec.name in self.proxies:
            raise errors.PROXY_ALREADY_EXISTS
        proxy = self._new(spec)
        if spec.enabled is not False:
            await proxy.start()
        self.proxies[proxy.name] = proxy
        return proxy

    async def populate(self, specs: list[ProxyCreate]) -> tuple[list[Proxy], errors.ApiError | None]:
        """Create or replace proxies (``POST /populate``, ``--config``).

        A proxy with the same name and the same listen and upstream is kept as it is (open
        connections and toxics survive); one that differs is stopped and replaced. Input is
        checked before anything changes.

        Returns:
            (proxies created or kept so far, the error that stopped the run or None).
        Raises:
            ApiError: 400 a spec lacks name or upstream (nothing was changed).
        """
        for i, spec in enumerate(specs, start=1):
            if not spec.name:
                raise errors.MISSING_FIELD.joined(f"name at proxy {i}")
            if not spec.upstream:
                raise errors.MISSING_FIELD.joined(f"upstream at proxy {i}")
        done: list[Proxy] = []
        for spec in specs:
            try:
                existing = self.proxies.get(spec.name)
                if existing is not None:
                    if not existing.differs(spec.listen or "127.0.0.1:0", spec.upstream):
                        done.append(existing)
                        continue
                    existing.stop()
                    del self.proxies[spec.name]
                proxy = self._new(spec)
                if spec.enabled is not False:
                    await proxy.start()
                self.proxies[proxy.name] = proxy
                done.append(proxy)
            except errors.ApiError as exc:
                return done, exc
        return done, None

    def remove(self, name: str) -> None:
        """Stop and delete proxy ``name`` (its counters stay in /metrics).

        Raises:
            ApiError: 404 "proxy not found".
        """
        proxy = self.get(name)
        proxy.stop()
        del self.proxies[name]

    async def reset(self) -> None:
        """Enable every proxy and remove every toxic (``POST /reset``).

        Raises:
            ApiError: 500 a proxy's listen address cannot be bound again.
        """
        pending = []
        for proxy in list(self.proxies.values()):
            await proxy.start()
            pending += proxy.toxics.reset()
        if pending:  # resets already under way complete first (Toxiproxy's RemoveToxic waits)
            await asyncio.gather(*pending, return_exceptions=True)

    def close(self) -> None:
        """Stop every proxy (server shutdown)."""
        for proxy in self.proxies.values():
            proxy.stop()
