"""The real Toxiproxy (Shopify's ``toxiproxy-server``) as the stack's fault proxy.

    stack variable KVCHAOS_PROXY = bundled | real      (``kvchaos run --proxy``, env KVCHAOS_PROXY)
        bundled: ``kvchaos proxy serve`` (chaos/proxy/server.py)
        real:    ``kvchaos proxy serve --impl real`` execs ``toxiproxy-server -host H -port P
                 -proxy-metrics`` (same pid, so the stack's process, journal and health probe
                 see the real server itself)

The binary is ``$KVCHAOS_TOXIPROXY_BIN`` when set, else ``toxiproxy-server`` on ``PATH``.
Under the compose backend the same choice picks the image: ``real`` runs
``kvchaos/toxiproxy:<version>``, built offline from that binary (compose/toxiproxy.Dockerfile,
``FROM scratch``: the binary is static), ``bundled`` runs ``kvchaos proxy serve`` in the
engine's image.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
from pathlib import Path

__all__ = ["PROXY_IMPLS", "BIN_ENV", "PROXY_ENV", "find_binary", "binary_version", "verified_binary",
           "real_argv", "selected_impl",
           "MissingToxiproxy", "asks_for_real", "use_proxy", "PROXY_OPTION_HELP"]

#: The values of the stack variable ``KVCHAOS_PROXY`` (and of ``--proxy``).
PROXY_IMPLS = ("bundled", "real")
#: Environment variable naming the real server's binary.
BIN_ENV = "KVCHAOS_TOXIPROXY_BIN"
#: The stack variable that selects the proxy.
PROXY_ENV = "KVCHAOS_PROXY"
#: Help text of every ``--proxy`` option.
PROXY_OPTION_HELP = ("the stack's fault proxy: bundled (kvchaos proxy serve) or real (Toxiproxy: "
                     "toxiproxy-server from $KVCHAOS_TOXIPROXY_BIN or PATH; under --backend compose "
                     "an image built from it); sets the stack variable KVCHAOS_PROXY")
#: Name of the binary on PATH (Toxiproxy's release archives and packages).
BIN_NAME = "toxiproxy-server"


class MissingToxiproxy(FileNotFoundError):
    """The real Toxiproxy was asked for and no binary was found."""


def find_binary(environ: dict[str, str] | None = None) -> Path:
    """The real Toxiproxy binary: ``$KVCHAOS_TOXIPROXY_BIN``, else ``toxiproxy-server`` on PATH.

    Raises:
        MissingToxiproxy: the variable names no executable file, or nothing is on PATH; the
            message says what to set.
    """
    env = os.environ if environ is None else environ
    given = env.get(BIN_ENV)
    if given:
        path = Path(given).expanduser()
        if path.is_file() and os.access(path, os.X_OK):
            return path.resolve()
        raise MissingToxiproxy(f"{BIN_ENV}={given}: not an executable file")
    found = shutil.which(BIN_NAME, path=env.get("PATH"))
    if found:
        return Path(found).resolve()
    raise MissingToxiproxy(f"the real Toxiproxy was asked for (--proxy real / {PROXY_ENV}=real) but "
                           f"{BIN_NAME} is not on PATH; set {BIN_ENV} to its path")


@functools.lru_cache(maxsize=8)
def _version_of(path: str, mtime_ns: int) -> str:
    try:
        out = subprocess.run([path, "-version"], capture_output=True, text=True, timeout=10,
                             stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise MissingToxiproxy(f"{path}: cannot run it ({exc})") from None
    text = (out.stdout + out.stderr).strip()
    m = re.search(r"toxiproxy\S*\s+version\s+v?(\d+\.\d+\S*)", text, re.IGNORECASE)
    if out.returncode != 0 or m is None:
        raise MissingToxiproxy(f"{path} is not Toxiproxy: `{Path(path).name} -version` exited "
                               f"{out.returncode} and printed {text[:200]!r} (Toxiproxy prints "
                               "'toxiproxy-server version X.Y.Z')")
    return m.group(1)


def binary_version(binary: Path) -> str:
    """The version the real server reports (``2.9.0`` from ``toxiproxy-server -version``,
    which prints ``toxiproxy-server version 2.9.0``: Toxiproxy's ``cmd/server/server.go``);
    cached per path and modification time.

    Raises:
        MissingToxiproxy: it does not run, or does not answer ``-version`` as Toxiproxy does (a
            wrong file named by ``$KVCHAOS_TOXIPROXY_BIN`` fails here, before any stack starts,
            not as a proxy that never becomes healthy).
    """
    try:
        mtime = Path(binary).stat().st_mtime_ns
    except OSError as exc:
        raise MissingToxiproxy(f"{binary}: {exc}") from None
    return _version_of(str(binary), mtime)


def verified_binary(environ: dict[str, str] | None = None) -> tuple[Path, str]:
    """:func:`find_binary` (an absolute path) and its :func:`binary_version`.

    Raises:
        MissingToxiproxy: no binary, or one that is not Toxiproxy.
    """
    path = find_binary(environ)
    return path, binary_version(path)


def real_argv(host: str, port: int, *, seed: int | None = None, config: Path | None = None,
              environ: dict[str, str] | None = None) -> list[str]:
    """argv of the real server listening on ``host:port`` with its byte counters on
    (``-proxy-metrics``: ``toxiproxy_proxy_{received,sent}_bytes_total`` at ``/metrics``).

    Flags from Toxiproxy 2.9.0's ``cmd/server/server.go`` (``-host``, ``-port``, ``-seed``,
    ``-config``, ``-proxy-metrics``).

    Raises:
        MissingToxiproxy: see :func:`find_binary`.
    """
    argv = [str(find_binary(environ)), "-host", host, "-port", str(port), "-proxy-metrics"]
    if seed is not None:
        argv += ["-seed", str(seed)]
    if config is not None:
        argv += ["-config", str(config)]
    return argv


def selected_impl(environ: dict[str, str] | None = None) -> str | None:
    """The proxy the stack variable ``KVCHAOS_PROXY`` asks for ("bundled" / "real"), or None
    when unset (each backend's default).

    Raises:
        ValueError: any other value.
    """
    env = os.environ if environ is None else environ
    value = (env.get(PROXY_ENV) or "").strip()
    if not value:
        return None
    if value not in PROXY_IMPLS:
        raise ValueError(f"{PROXY_ENV}={value!r}: use one of {', '.join(PROXY_IMPLS)}")
    return value


def asks_for_real(argv: list[str]) -> bool:
    """True when ``argv`` is ``kvchaos proxy serve ... --impl real`` (or ``--impl=real``): the
    command that execs the real server, whose binary must exist before the stack starts."""
    if len(argv) < 3 or Path(argv[0]).name != "kvchaos" or argv[1:3] != ["proxy", "serve"]:
        return False
    rest = argv[3:]
    for i, a in enumerate(rest):
        if a == "--impl" and i + 1 < len(rest):
            return rest[i + 1] == "real"
        if a.startswith("--impl="):
            return a.partition("=")[2] == "real"
    return False


def use_proxy(impl: str | None) -> None:
    """Select the stack's proxy for every stack this process starts afterwards: sets the stack
    variable ``KVCHAOS_PROXY`` in ``os.environ`` (what ``--proxy`` and ``--kvchaos-proxy`` do).
    ``None`` leaves the environment as it is.

    Raises:
        ValueError: ``impl`` is not one of :data:`PROXY_IMPLS`.
    """
    if impl is None:
        return
    if impl not in PROXY_IMPLS:
        raise ValueError(f"--proxy {impl!r}: use one of {', '.join(PROXY_IMPLS)}")
    os.environ[PROXY_ENV] = impl
