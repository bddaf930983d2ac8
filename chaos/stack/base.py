"""What every stack backend offers the runner and the faults.

    Stack (this module) ── LocalStack   (chaos/stack/local.py: processes on 127.0.0.1)
                        └─ ComposeStack (chaos/stack/compose.py: docker compose)

Both read the same stack file (chaos/stack/spec.py); after ``up()`` the addresses in
``settings`` are the same under both, since every service uses ``network_mode: host``.
"""

from __future__ import annotations

import abc
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from chaos.journal import Journal
from chaos.stack.spec import KvchaosSettings, StackError, StackSpec


@dataclass
class ServiceExit:
    """A service process that ended while the stack was up.

    ``expected`` is True when kvchaos ended it (a kill fault, restart or down)."""

    service: str
    time: float
    returncode: int | None
    expected: bool


@dataclass
class ServiceStatus:
    """One service's state as seen by the backend."""

    name: str
    state: str  # "running" | "paused" | "exited" | "not-started"
    pid: int | None = None
    healthy: bool | None = None
    returncode: int | None = None
    detail: dict[str, Any] = field(default_factory=dict)


def new_run_id(prefix: str = "stack") -> str:
    """A unique, sortable id: ``<prefix>-YYYYmmdd-HHMMSS-<6 hex>``."""
    return f"{prefix}-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"


def cleanup_hint(journal: Journal) -> str:
    """The end of a message naming what a stack's teardown could not undo: who undoes it."""
    return f"`kvchaos cleanup` undoes it once this run has ended (journal {journal.path})"


def down_after_failed_up(stack: "Stack", failure: BaseException) -> None:
    """``stack.down()`` while ``failure`` (a failed start-up, a signal) is on its way out of
    ``up()``: what the teardown could not undo (a StackError of ``down()``) is added to
    ``failure`` as a note, so the failure is still what is raised and what is left is not
    silent (and stays in the journal for ``kvchaos cleanup``)."""
    try:
        stack.down()
    except StackError as left:
        failure.add_note(str(left))


class Stack(abc.ABC):
    """A running (or startable) stack. Use as a context manager: ``down()`` runs on every exit.

    Attributes:
        journal: where the backend records what it starts (processes, containers, mounts).
        spec: the validated stack file.
        env: the variables it was interpolated with.
        settings: the ``x-kvchaos`` settings, interpolated.
        run_dir: the stack's scratch folder (logs, L2 filesystem, state).
    """

    backend: str = "abstract"

    def __init__(self, spec: StackSpec, run_dir: Path) -> None:
        self.spec = spec
        self.env = spec.env
        self.settings: KvchaosSettings = spec.settings
        self.run_dir = Path(run_dir)
        self.exits: list[ServiceExit] = []
        #: The last wait for the engine after kvchaos restarted LMCache under it
        #: (chaos/stack/reconnect.py ``wait_engine_reconnected``); None before any.
        self.last_reconnect: dict[str, Any] | None = None
        #: Side effects to undo if the runner dies (chaos/journal.py); set by each backend.
        self.journal: Journal

    # --- lifecycle ---------------------------------------------------------------------
    @abc.abstractmethod
    def up(self) -> None:
        """Start every service in dependency order and wait for each health check.

        Raises:
            StackError: a service failed to start or to become healthy within its deadline;
                everything already started is stopped again before it is raised.
        """

    @abc.abstractmethod
    def down(self) -> None:
        """Stop every service and leave nothing behind (processes, containers, ports)."""

    @abc.abstractmethod
    def status(self) -> dict[str, ServiceStatus]:
        """State of each service."""

    # --- faults ------------------------------------------------------------------------
    @abc.abstractmethod
    def kill(self, service: str, sig: str = "SIGKILL") -> None:
        """Send ``sig`` (a name like ``SIGKILL``) to the service's processes; the exit that
        follows is recorded as expected."""

    @abc.abstractmethod
    def start(self, service: str, wait: bool = True) -> None:
        """Start a stopped service (and wait for its health check when ``wait``)."""

    def restart(self, service: str, wait: bool = True) -> None:
        """Stop the service gracefully, then start it again."""
        self.stop(service)
        self.start(service, wait=wait)

    @abc.abstractmethod
    def stop(self, service: str) -> None:
        """Stop one service gracefully (its stop_signal, then SIGKILL after the grace period)."""

    @abc.abstractmethod
    def pause(self, service: str) -> None:
        """Freeze the service (SIGSTOP / docker pause): a gray failure."""

    @abc.abstractmethod
    def resume(self, service: str) -> None:
        """Undo :meth:`pause`."""

    @abc.abstractmethod
    def wait_healthy(self, service: str, timeout_s: float | None = None) -> None:
        """Block until the service's health check passes.

        Raises:
            StackError: it did not within ``timeout_s`` (default: the health check's own deadline)
                or its process ended.
        """

    @abc.abstractmethod
    def collect_logs(self, dest_dir: Path) -> list[Path]:
        """Copy each service's log into ``dest_dir``; returns the files written."""

    def reconfigure(self, variables: dict[str, str], restart: list[str] | None = None,
                    reconnect_timeout_s: float | None = None) -> list[str]:
        """Set stack variables (e.g. ``KVCHAOS_ENGINE_BUGS``, ``LMCACHE_L1_SIZE_GB``), interpolate
        the stack file again with them, and restart every service whose command or environment
        changed (and those in ``restart``). Ports and the run dir stay as they are. When LMCache
        restarts under a running engine, the new server starts once the engine has seen the old
        one go, and then this waits (at most ``reconnect_timeout_s``, default 30 s) until the
        engine uses it again (chaos/stack/reconnect.py).

        Returns:
            The services restarted, in start order.

        Raises:
            ConfigError: the file no longer validates; StackError: a restart failed.
        """
        changed = self.set_variables(variables) + list(restart or [])
        order = [n for wave in self.spec.start_order() for n in wave if n in changed]
        under = self.engine_under_lmcache(order)
        contexts = self.lmcache_contexts() if under else None
        for name in reversed(order):
            self.stop(name)
        noticed = None
        if under:
            # A restart the engine's heartbeat does not see is never recovered from (LMCache
            # issue 4642): start the new server only once the engine saw the old one go.
            from chaos.stack.reconnect import wait_engine_noticed

            noticed = wait_engine_noticed(self)
        for name in order:
            self.start(name)
        if under:
            self.wait_engine_reconnected(contexts, reconnect_timeout_s)
            assert self.last_reconnect is not None
            self.last_reconnect["outage_noticed"] = noticed
        return order

    # --- the engine's LMCache client across LMCache restarts ----------------------------
    def engine_under_lmcache(self, restarted: list[str]) -> bool:
        """True when ``restarted`` holds the stack's LMCache service but not its engine, and the
        engine is running: the engine must reconnect to the new server by itself."""
        lm, engine = self.settings.lmcache, self.settings.engine
        if not lm or not engine or lm not in restarted or engine in restarted:
            return False
        st = self.status().get(engine)
        return st is not None and st.state == "running"

    def lmcache_contexts(self) -> int | None:
        """KV-cache contexts LMCache lists as registered now (None: no ``lmcache_http``, or it
        does not answer); see chaos/stack/reconnect.py."""
        from chaos.stack.reconnect import registered_contexts

        return registered_contexts(self.settings.lmcache_http) if self.settings.lmcache_http else None

    def wait_engine_reconnected(self, contexts_before: int | None, timeout_s: float | None = None) -> dict[str, Any]:
        """Wait (at most ``timeout_s``, default 30 s) until the engine uses a restarted or resumed
        LMCache again; the result is also kept in :attr:`last_reconnect`. Never raises (see
        chaos/stack/reconnect.py ``wait_engine_reconnected``)."""
        from chaos.stack.reconnect import RECONNECT_TIMEOUT_S, wait_engine_reconnected

        self.last_reconnect = wait_engine_reconnected(
            self, contexts_before, RECONNECT_TIMEOUT_S if timeout_s is None else timeout_s)
        return self.last_reconnect

    def set_variables(self, variables: dict[str, str]) -> list[str]:
        """Interpolate the stack file again with ``variables`` set, without restarting anything
        (for a stack that is down, or before :meth:`reconfigure` restarts what changed).

        Returns:
            The services whose command or environment changed.

        Raises:
            ConfigError: the file no longer validates.
        """
        from chaos.stack.spec import load_stack

        environ = dict(self.env)
        environ.update(variables)
        old = self.spec
        spec = load_stack(self.spec.path, environ=environ, run_dir=self.run_dir)
        changed = [n for n in spec.services
                   if spec.services[n].argv(self.backend) != old.services[n].argv(self.backend)
                   or spec.services[n].env() != old.services[n].env()]
        self.spec, self.env, self.settings = spec, spec.env, spec.settings
        return changed

    def unexpected_exits(self) -> list[ServiceExit]:
        """Exits no kvchaos action caused (for the liveness check)."""
        self.status()
        return [e for e in self.exits if not e.expected]

    def _start_in_dependency_order(self, names: list[str], start: Callable[[list[str]], None],
                                   wait: Callable[[list[str]], None]) -> None:
        """Start ``names`` wave by wave: a service starts once each ``depends_on`` entry is
        started (``service_started``) or healthy (``service_healthy``); ``wait`` blocks until
        the services given are healthy. Everything started is waited for at the end."""
        pending = [n for n in self.spec.services if n in names]
        started: set[str] = set()
        healthy: set[str] = set()
        while pending:
            ready = [n for n in pending if all(
                (d in healthy) if c == "service_healthy" else (d in started)
                for d, c in self.spec.services[n].dependencies().items())]
            if ready:
                start(ready)
                started.update(ready)
                pending = [n for n in pending if n not in ready]
                continue
            wait(sorted(started - healthy))
            healthy |= started
        wait(sorted(started - healthy))

    # --- proxy -------------------------------------------------------------------------
    def populate_links(self) -> None:
        """Create the ``x-kvchaos.links`` proxies on the stack's Toxiproxy (idempotent:
        Toxiproxy's ``POST /populate`` replaces proxies of the same name).

        Raises:
            StackError: the proxy's API failed (e.g. a link's listen port is taken), naming the
                proxy service, and for each link whose listen port a process outside the stack
                holds, the link, its port variable, the port and that process (pid and command
                line, :meth:`link_port_holders`); every caller (start, restart, reset between
                scenarios, a fault's heal) then reports an infrastructure error instead of
                crashing.
        """
        if not self.settings.links or self.settings.proxy is None:
            return
        from chaos.proxy.client import ToxiproxyClient

        proxy = self.settings.proxy
        try:
            with ToxiproxyClient(proxy.api) as client:
                client.populate([{"name": n, "listen": link.listen, "upstream": link.upstream, "enabled": True}
                                 for n, link in self.settings.links.items()])
        except Exception as exc:  # ToxiproxyError (HTTP errors and refusals), OSError, a bad answer
            held = self.link_port_holders(str(exc))
            why = f" ({'; '.join(held)})" if held else ""
            raise StackError(f"could not create the proxy links on {proxy.api}: {exc}{why}", proxy.service) from exc

    def own_pids(self) -> set[int] | None:
        """The live host pids of every process this stack started (each service's process
        group, each container's processes); None where the backend cannot tell."""
        return None

    def proxy_info(self) -> dict[str, str] | None:
        """Which fault proxy serves this stack's links, for reports: ``{"impl": "bundled" |
        "real" | "external" | <program>, "api": URL, "version": ..., "binary" or "image": ...}``;
        None when the stack has no proxy. Never raises: what cannot be told is left out."""
        proxy = self.settings.proxy
        if proxy is None:
            return None
        info = {"api": str(proxy.api)}
        if proxy.service is None:
            return {**info, "impl": "external"}
        try:
            info.update(self._proxy_info(proxy.service))
        except Exception as exc:  # noqa: BLE001 - a report must not be lost for this
            info["impl"] = info.get("impl", "unknown")
            info["error"] = str(exc)[:200]
        return info

    def _proxy_info(self, service: str) -> dict[str, str]:
        """The proxy service's ``impl``/``version``/``binary`` from its command (the local
        backend's view; the compose backend reads its container's image)."""
        from pathlib import Path as _Path

        import chaos
        from chaos.proxy.real import asks_for_real, binary_version, find_binary

        argv = self.spec.services[service].argv(self.backend)
        if asks_for_real(argv):
            binary = find_binary(self.env)
            return {"impl": "real", "version": binary_version(binary), "binary": str(binary)}
        if len(argv) >= 3 and _Path(argv[0]).name == "kvchaos" and argv[1:3] == ["proxy", "serve"]:
            return {"impl": "bundled", "version": chaos.__version__}
        return {"impl": _Path(argv[0]).name if argv else "unknown"}

    def service_pids(self, name: str) -> set[int] | None:
        """The live host pids of service ``name`` (its process group, or its container's
        processes); None where the backend cannot tell, or the service's sockets are not in the
        host's network namespace (then no listener seen from here can be checked against it)."""
        return None

    def service_log_tail(self, name: str) -> str:
        """The last lines of service ``name``'s log, for error messages ("" when there is none)."""
        return ""

    def service_ports(self, name: str) -> dict[int, str]:
        """``{port: variable}`` of the stack's ``*_PORT`` variables that the service's command
        (under this backend) names: the ports it binds, and those it connects to."""
        import re

        argv = " ".join(self.spec.services[name].argv(self.backend))
        out = {}
        for var, value in self.env.items():
            if var.endswith("_PORT") and value.isdigit() and re.search(rf"(?<![0-9]){value}(?![0-9])", argv):
                out[int(value)] = var
        return out

    def foreign_listeners(self, name: str) -> list[str]:
        """For each port the service's command names, the listeners no process of this stack
        owns: ``["port 28100 (ENGINE_PORT) is held by pid 123 (kvchaos engine serve ...)"]``;
        [] where the backend cannot tell its own processes (:meth:`own_pids` None)."""
        from chaos.stack.probe import listeners

        found: list[str] = []
        ours: set[int] | None = None
        for port, var in sorted(self.service_ports(name).items()):
            owners = listeners(port)
            if not owners:
                continue
            if ours is None:
                ours = self.own_pids()
                if ours is None:
                    return []
            foreign = [o for o in owners if o.pid not in ours]
            if foreign:
                found.append(f"port {port} ({var}) is held by " + ", ".join(o.describe() for o in foreign))
        return found

    def lost_binds(self, name: str) -> list[str]:
        """Why service ``name``, which exited before it was healthy, may not have been able to
        bind its ports: :meth:`foreign_listeners`, and for each port it names that nothing
        listens on, the connections that hold it as their source port
        (chaos/stack/probe.py :func:`source_port_users`): ``["port 38080 (LMCACHE_HTTP_PORT) is
        the source port of pid 123 (...) (127.0.0.1:38080 -> 127.0.0.1:35556 (ESTABLISHED))"]``.
        Either makes the exit a lost bind, not the service's own crash. [] where the backend
        cannot tell its own processes."""
        from chaos.stack.probe import source_port_users

        found = self.foreign_listeners(name)
        if self.own_pids() is None:
            return found
        mine = self.service_pids(name) or set()
        for port, var in sorted(self.service_ports(name).items()):
            users = [u for u in source_port_users(port) if u.pid not in mine]
            if users:
                found.append(f"port {port} ({var}) is the source port of a connection of "
                             + ", ".join(f"{u.describe()} ({u.address})" for u in users))
        return found

    def check_identity(self, name: str, url: str) -> None:
        """After a health probe of ``url`` passed: the socket listening on its port must belong
        to service ``name``'s own processes (:meth:`service_pids`); else another process
        answered (a concurrent stack, another program) and the stack must not go on with it.
        Skipped for remote addresses and where the backend cannot tell (:meth:`service_pids`
        None).

        Raises:
            StackError: naming the service, the port (and its variable) and the process that
                holds it.
        """
        from chaos.stack.probe import is_local_host, listeners, url_host_port

        host, port = url_host_port(url)
        if port is None or not is_local_host(host):
            return  # a remote address: its listener is not visible from here
        mine = self.service_pids(name)
        if mine is None:
            return
        owners = listeners(port)
        if any(o.pid in mine for o in owners):
            return
        who = ", ".join(o.describe() for o in owners) or "no process kvchaos can see"
        started = f"pid {min(mine)}" if mine else "no live process"
        raise StackError(f"service {name!r}: its health check {url} was answered by {who}, not by the "
                         f"process kvchaos started ({started}); port {port} "
                         f"({self.service_ports(name).get(port) or self.port_variable(port) or 'its port'}) "
                         "is taken by another process: stop it or set the port variable", name,
                         self.service_log_tail(name))

    def port_variable(self, port: int) -> str | None:
        """The stack's ``*_PORT`` variable(s) set to ``port`` (``"A_PORT/B_PORT"``), or None."""
        names = [k for k, v in sorted(self.env.items()) if k.endswith("_PORT") and v.strip() == str(port)]
        return "/".join(names) or None

    def link_port_holders(self, error: str = "") -> list[str]:
        """For each link whose listen port a process outside this stack listens on, on any
        address: ``"link 'cache-link': port 21905 (LMCACHE_PROXY_PORT) is held by pid 123
        (python -m http.server 21905)"`` (chaos/stack/probe.py ``listeners``). Where the backend
        cannot tell its own processes (:meth:`own_pids` None), only the links whose port
        ``error`` (the proxy's answer) names are looked at: the proxy holds the others itself."""
        import re

        from chaos.stack.probe import listeners

        ours = self.own_pids()
        found = []
        for name, link in self.settings.links.items():
            port = int(link.listen.rpartition(":")[2])
            if ours is None and not re.search(rf"(?<![0-9]){port}(?![0-9])", error):
                continue
            foreign = [o for o in listeners(port) if ours is None or o.pid not in ours]
            if foreign:
                found.append(f"link {name!r}: port {port} ({self.port_variable(port) or 'no port variable'}) "
                             "is held by " + ", ".join(o.describe() for o in foreign))
        return found

    def release_ports(self) -> None:
        """Drop the host-wide claims on this stack's ports (chaos/stack/ports.py), e.g. once a
        pool forgot a stack that did not start: another stack of this process may set them."""
        from chaos.stack.ports import release_all
        from chaos.stack.spec import port_owner

        release_all(port_owner(self.run_dir))

    # --- context manager ---------------------------------------------------------------
    def __enter__(self) -> "Stack":
        self.up()
        return self

    def __exit__(self, *exc: object) -> None:
        self.down()
