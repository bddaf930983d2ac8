"""The proxy server: the REST API and every proxy, in one asyncio event loop.

::

    API client --HTTP--> Api (aiohttp, default 127.0.0.1:8474)
                           |
                      ProxyCollection --> Proxy --> Connection --> ToxicLink x2 --> sockets

Binding the API off loopback needs ``allow_remote`` (the API can open arbitrary TCP links);
the same switch governs proxy listen addresses.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from pathlib import Path

from aiohttp import web
from pydantic import TypeAdapter, ValidationError

from chaos.proxy import errors
from chaos.proxy.api import Api
from chaos.proxy.collection import ProxyCollection
from chaos.proxy.models import ProxyCreate
from chaos.proxy.proxy import is_loopback, join_address

log = logging.getLogger(__name__)

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8474  # Toxiproxy's API port


class ConfigError(Exception):
    """The ``--config`` file cannot be read, parsed or applied."""


def load_config(path: Path) -> list[ProxyCreate]:
    """Read a Toxiproxy ``-config`` file: a JSON list of ``{name, listen, upstream, enabled}``.

    Raises:
        ConfigError: unreadable file, invalid JSON or a bad entry (message names the file).
    """
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror}") from None
    try:
        return TypeAdapter(list[ProxyCreate]).validate_json(text)
    except ValidationError as exc:
        raise ConfigError(f"{path}: {errors.describe(exc)}") from None


class ProxyServer:
    """Runs the API and the proxies; ``start()`` then ``stop()``, or ``serve_forever()``."""

    def __init__(self, host: str = DEFAULT_HOST, port: int = DEFAULT_PORT,
                 allow_remote: bool = False, seed: int | None = None) -> None:
        """Configure the server.

        Raises:
            ValueError: ``host`` is not loopback and ``allow_remote`` is false.
        """
        if not allow_remote and not is_loopback(host):
            raise ValueError(f"refusing to bind the API to {host}: not a loopback address; "
                             "pass --allow-remote to allow it")
        self.host = host
        self.port = port
        self.collection = ProxyCollection(seed=seed, allow_remote=allow_remote)
        self._runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        """Base URL of the API (the bound port once started)."""
        return f"http://{join_address(self.host, self.port)}"

    async def start(self, config: list[ProxyCreate] | None = None) -> None:
        """Create the ``config`` proxies, then listen for the API (port 0: a free port).

        Raises:
            ConfigError: a config proxy could not be created.
            OSError: the API address cannot be bound.
        """
        if config:
            try:
                _, err = await self.collection.populate(config)
            except errors.ApiError as exc:
                err = exc
            if err is not None:
                self.collection.close()
                raise ConfigError(f"config: {err.message}")
        # shutdown_timeout: a request still running at stop (a client stalled mid-body) may hold
        # the stop back for at most this long.
        self._runner = web.AppRunner(Api(self.collection).app(), access_log=None,
                                     handle_signals=False, shutdown_timeout=2.0)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port, reuse_address=True)
        await site.start()
        server = site._server  # aiohttp exposes no public accessor for the bound port
        if server is not None and getattr(server, "sockets", None):
            self.port = server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        """Close every proxy and connection, then the API."""
        self.collection.close()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def serve_forever(self, config: list[ProxyCreate] | None = None) -> None:
        """Start, print the API address, and run until SIGINT/SIGTERM."""
        await self.start(config)
        print(f"kvchaos proxy: API listening on {self.url}", flush=True)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        try:
            await stop.wait()
        finally:
            await self.stop()

