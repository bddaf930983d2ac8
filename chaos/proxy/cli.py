"""``kvchaos proxy serve``: run the Toxiproxy-compatible fault proxy.

Also ``python -m chaos.proxy [serve] [OPTIONS]``, which stacks run as a process.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any, Coroutine, Optional

import typer

from chaos.proxy.server import DEFAULT_HOST, DEFAULT_PORT, ConfigError, ProxyServer, load_config

app = typer.Typer(help="Toxiproxy-compatible TCP fault proxy (REST API of Toxiproxy 2.x).",
                  no_args_is_help=True)


def run_loop(main: Coroutine[Any, Any, None], loop: str = "auto") -> None:
    """Run ``main`` on uvloop (libuv; about 2x the proxy's throughput) or plain asyncio.

    Raises:
        typer.BadParameter: ``loop`` is unknown, or "uvloop" without uvloop installed.
    """
    if loop not in ("auto", "uvloop", "asyncio"):
        raise typer.BadParameter(f"--loop {loop!r}: want auto, uvloop or asyncio")
    if loop != "asyncio":
        try:
            import uvloop
        except ImportError:
            if loop == "uvloop":
                raise typer.BadParameter("--loop uvloop: uvloop is not installed") from None
        else:
            uvloop.run(main)
            return
    asyncio.run(main)


@app.callback()
def _group() -> None:
    """Toxiproxy-compatible TCP fault proxy."""


@app.command()
def serve(
    host: str = typer.Option(DEFAULT_HOST, help="API bind address (loopback unless --allow-remote)."),
    port: int = typer.Option(DEFAULT_PORT, help="API port; 0 picks a free port (printed)."),
    config: Optional[Path] = typer.Option(
        None, "--config", help="JSON list of proxies to create at start, like Toxiproxy's -config."),
    allow_remote: bool = typer.Option(
        False, "--allow-remote", help="Allow non-loopback API and proxy listen addresses."),
    seed: Optional[int] = typer.Option(None, help="Seed of the toxicity rolls (reproducible runs)."),
    log_level: str = typer.Option("warning", help="debug, info, warning or error."),
    loop: str = typer.Option(
        "auto", help="Event loop: auto (uvloop when installed), uvloop or asyncio."),
    impl: str = typer.Option(
        "bundled", "--impl", help="bundled (this proxy) or real: exec the real Toxiproxy "
        "(toxiproxy-server from $KVCHAOS_TOXIPROXY_BIN or PATH) on the same address, with -proxy-metrics"),
) -> None:
    """Serve the API and the proxies until SIGINT/SIGTERM.

    Prints ``kvchaos proxy: API listening on http://HOST:PORT`` once ready. Exit status 2 for
    a bad option or config file (or ``--impl real`` without a toxiproxy-server binary), 3 if
    the API address cannot be bound. ``--impl real`` replaces this process with the real server
    (same pid), so ``--allow-remote`` and ``--loop`` do not apply to it.
    """
    if impl not in ("bundled", "real"):
        typer.echo(f"kvchaos proxy: --impl {impl!r}: want bundled or real", err=True)
        raise typer.Exit(2)
    if impl == "real":
        import os

        from chaos.proxy.real import MissingToxiproxy, real_argv

        try:
            argv = real_argv(host, port, seed=seed, config=config)
        except MissingToxiproxy as exc:
            typer.echo(f"kvchaos proxy: {exc}", err=True)
            raise typer.Exit(2) from None
        import shlex
        import sys

        # the service log then says which server answered (the real one writes its own lines)
        print(f"kvchaos proxy: exec {shlex.join(argv)}", file=sys.stderr, flush=True)
        os.execv(argv[0], argv)
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        server = ProxyServer(host, port, allow_remote=allow_remote, seed=seed)
        specs = load_config(config) if config is not None else None
    except (ValueError, ConfigError) as exc:
        typer.echo(f"kvchaos proxy: {exc}", err=True)
        raise typer.Exit(2) from None
    try:
        run_loop(server.serve_forever(specs), loop)
    except ConfigError as exc:
        typer.echo(f"kvchaos proxy: {exc}", err=True)
        raise typer.Exit(2) from None
    except OSError as exc:
        typer.echo(f"kvchaos proxy: cannot listen on {host}:{port}: {exc.strerror or exc}", err=True)
        raise typer.Exit(3) from None
