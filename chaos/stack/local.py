"""LocalStack: a stack file's services as local processes on 127.0.0.1, no Docker.

Each service's ``command`` runs in its own process group (so a signal reaches its children),
with its log in ``<run_dir>/logs/<service>.log``, the telemetry-off environment
(chaos/stack/environment.py) and this virtual environment first on ``PATH``. Services start in
``depends_on`` order; a ``service_healthy`` dependency waits for the dependency's health check
(tenacity, with the check's own deadline). Every started process is written to the run's
journal first, so ``kvchaos cleanup`` can end it if the runner dies.

State for a detached stack (``kvchaos stack up``) lives in ``<run_dir>/state.json``; another
process re-attaches with :meth:`LocalStack.attach` to report status or bring it down.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import threading
import time
import weakref
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import psutil
from tenacity import Retrying, retry_if_result, stop_after_delay, wait_fixed

from chaos import interrupts
from chaos.journal import Journal
from chaos.procid import identity, same_process
from chaos.proxy.real import BIN_ENV, MissingToxiproxy, asks_for_real, verified_binary
from chaos.stack.base import (ServiceExit, ServiceStatus, Stack, StackError, cleanup_hint, down_after_failed_up,
                              new_run_id)
from chaos.stack.environment import service_environment
from chaos.stack.mounts import unmount_all
from chaos.stack.ports import release_all
from chaos.stack.probe import group_pids, probe, probe_url_of
from chaos.stack.spec import Service, StackSpec, load_stack, port_owner, socket_dir

#: How long ``kill(..., "SIGKILL")`` waits for the process group to disappear (s).
KILL_WAIT_S = 10.0


def signal_number(sig: str | int) -> int:
    """``"SIGKILL"``/``"KILL"``/``9`` -> 9.

    Raises:
        ValueError: not a signal name or number.
    """
    if isinstance(sig, int):
        return int(signal.Signals(sig))
    name = sig.upper()
    if not name.startswith("SIG"):
        name = "SIG" + name
    try:
        return int(signal.Signals[name])
    except KeyError:
        raise ValueError(f"unknown signal {sig!r}") from None


@dataclass
class _Proc:
    service: str
    pid: int
    pgid: int
    create_time: float
    log_path: Path
    popen: subprocess.Popen | None = None
    #: :func:`chaos.procid.identity` of the process (start_ticks, boot_id), the pid reuse guard
    ident: dict = field(default_factory=dict)
    expected_exit: bool = False
    paused: bool = False
    healthy: bool | None = None
    returncode: int | None = None
    exit_recorded: bool = False

    def alive(self) -> bool:
        if self.popen is not None:
            rc = self.popen.poll()
            if rc is not None:
                self.returncode = rc
                return False
            return True
        try:
            if not same_process(self.pid, {"create_time": self.create_time, **self.ident}):
                return False
            return psutil.Process(self.pid).status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False

    def group_alive(self) -> bool:
        """True while any process of the service's process group is alive (not a zombie)."""
        for p in psutil.process_iter(["pid", "status"]):
            try:
                if os.getpgid(p.info["pid"]) == self.pgid and p.info["status"] != psutil.STATUS_ZOMBIE:
                    return True
            except (ProcessLookupError, PermissionError, psutil.Error):
                continue
        return False


def log_tail(path: Path, lines: int = 30) -> str:
    """The last ``lines`` lines of a log file ("" if missing)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 64 * 1024))
            data = f.read().decode("utf-8", "replace")
    except OSError:
        return ""
    return "\n".join(data.splitlines()[-lines:])


class LocalStack(Stack):
    """Run a stack file's services as local processes.

    Args:
        path: the stack file.
        run_dir: scratch folder (logs, state, ``${KVCHAOS_RUN_DIR}``); a new folder under the
            state directory when None. ``${KVCHAOS_SOCKET_DIR}``, a short folder for Unix
            sockets, is removed at :meth:`down` when the file reads it.
        environ: base variables (``os.environ`` when None).
        run_id: names the journal; derived from the file name when None.
        journal: an existing journal to record into (the runner's), else a new one.

    Raises:
        ConfigError: the file is invalid, a command or health-check program cannot be found
            (raised here, before anything starts).
    """

    backend = "local"

    def __init__(self, path: str | Path, *, run_dir: Path | None = None,
                 environ: dict[str, str] | None = None, run_id: str | None = None,
                 journal: Journal | None = None, spec: StackSpec | None = None) -> None:
        self.run_id = run_id or new_run_id(Path(path).stem)
        if run_dir is None:
            from chaos.journal import state_dir
            run_dir = state_dir() / "stacks" / self.run_id
        run_dir = Path(run_dir).resolve()
        spec = spec or load_stack(path, environ=environ, run_dir=run_dir)
        super().__init__(spec, run_dir)
        self.journal = journal or Journal(self.run_id)
        self._procs: dict[str, _Proc] = {}
        self._lock = threading.RLock()
        self.log_dir = self.run_dir / "logs"
        # The ports picked for this stack stay claimed while the object lives (also across
        # down/up, when a suite restarts it), and are released with it or with the process.
        self._port_owner = port_owner(self.run_dir)
        #: ``${KVCHAOS_SOCKET_DIR}`` when a service reads it (chaos/stack/spec.py socket_dir)
        self._socket_dir = (socket_dir(self.run_dir) if "KVCHAOS_SOCKET_DIR" in self.spec.variables_read
                            else None)
        weakref.finalize(self, release_all, self._port_owner)
        self._check_programs()

    # --- validation before anything starts ----------------------------------------------
    def _check_programs(self) -> None:
        path_env = service_environment(base=self.env)["PATH"]
        for name, svc in self.spec.services.items():
            argv = svc.argv("local")
            if argv and shutil.which(argv[0], path=path_env) is None and not os.path.isfile(argv[0]):
                raise self.spec.service_error(
                    name, f"service {name!r}: program {argv[0]!r} not found on PATH "
                    "(install it, or run `kvchaos doctor`)", "command")
            if asks_for_real(argv):
                try:
                    binary, _version = verified_binary(self.env)
                except MissingToxiproxy as exc:
                    raise self.spec.service_error(name, f"service {name!r}: {exc}", "command") from None
                # the service runs in its own working directory: hand it the absolute path (a
                # relative $KVCHAOS_TOXIPROXY_BIN named a file only from the runner's)
                self.env[BIN_ENV] = str(binary)
            hc = svc.healthcheck
            probe_argv = hc.argv() if hc else None
            if probe_argv:
                url = probe_url_of(probe_argv)
                if url is not None:
                    try:
                        from urllib.parse import urlsplit
                        parts = urlsplit(url)
                        if parts.scheme not in ("http", "https", "tcp") or not parts.hostname:
                            raise ValueError(f"unsupported probe URL {url!r} (use http://, https:// or tcp://)")
                        _ = parts.port
                    except ValueError as exc:
                        raise self.spec.service_error(name, f"service {name!r}: bad health check: {exc}",
                                                      "healthcheck", "test") from None
                elif shutil.which(probe_argv[0], path=path_env) is None:
                    raise self.spec.service_error(
                        name, f"service {name!r}: health check program {probe_argv[0]!r} not found on PATH",
                        "healthcheck", "test")

    # --- state for detached stacks ---------------------------------------------------------
    @property
    def state_path(self) -> Path:
        return self.run_dir / "state.json"

    def _save_state(self) -> None:
        state = {
            "stack_file": str(Path(self.spec.path).resolve()),
            "run_id": self.run_id,
            "journal": str(self.journal.path),
            "env": {k: v for k, v in self.env.items() if k.endswith("_PORT") or k.startswith("KVCHAOS_")},
            "services": {n: {"pid": p.pid, "pgid": p.pgid, "create_time": p.create_time, **p.ident,
                             "log": str(p.log_path), "paused": p.paused}
                         for n, p in self._procs.items()},
        }
        self.run_dir.mkdir(parents=True, exist_ok=True)
        tmp = self.state_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(state, indent=2))
        tmp.replace(self.state_path)

    @classmethod
    def attach(cls, run_dir: Path) -> "LocalStack":
        """Re-attach to a stack started by another process from its ``state.json``.

        Raises:
            FileNotFoundError: no state in ``run_dir``.
        """
        run_dir = Path(run_dir)
        state = json.loads((run_dir / "state.json").read_text())
        environ = dict(os.environ)
        environ.update(state["env"])
        jpath = Path(state["journal"])
        journal = Journal(state["run_id"], directory=jpath.parent)
        # Its ports are its own (state.json), claimed or not since `stack up` ended: never refused.
        spec = load_stack(state["stack_file"], environ=environ, run_dir=run_dir.resolve(), refuse_claimed=False)
        stack = cls(state["stack_file"], run_dir=run_dir, environ=environ, run_id=state["run_id"],
                    journal=journal, spec=spec)
        for name, s in state["services"].items():
            stack._procs[name] = _Proc(name, s["pid"], s["pgid"], s["create_time"], Path(s["log"]),
                                       paused=s.get("paused", False),
                                       ident={k: s[k] for k in ("start_ticks", "boot_id") if k in s})
        return stack

    # --- lifecycle -------------------------------------------------------------------------
    def up(self, services: list[str] | None = None) -> None:
        """Start the services in dependency order, waiting on ``service_healthy`` dependencies
        and, at the end, on every service's health check.

        Args:
            services: start only these and what they depend on (all when None).

        Raises:
            StackError: an unknown service was named, a service exited or stayed unhealthy; the
                stack is brought down first.
        """
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        if self._socket_dir is not None:  # journaled first: `kvchaos cleanup` removes it after a crash
            self.journal.add("file", str(self._socket_dir), path=str(self._socket_dir))
        self._mount_l2()
        if self.settings.proxy is not None and self.settings.proxy.service is None:
            self.populate_links()
        wanted = self.spec.with_dependencies(services) if services else list(self.spec.services)
        try:
            self._start_in_dependency_order(wanted, lambda names: [self._spawn(n) for n in names],
                                            self._wait_many)
        except BaseException as exc:
            down_after_failed_up(self, exc)
            raise
        self._save_state()

    def _mount_l2(self) -> None:
        """Mount the size-capped tmpfs for the filesystem L2 (``x-kvchaos.l2_fs_size``)."""
        s = self.settings
        if not s.l2_fs_size or not s.l2_fs_path:
            return
        path = Path(s.l2_fs_path)
        path.mkdir(parents=True, exist_ok=True)
        if os.path.ismount(path):
            return
        if os.geteuid() != 0:
            # Everything but the disk_full fault works on a plain folder; disk_full itself refuses
            # with a message naming the missing mount.
            with (self.log_dir / "kvchaos-stack.log").open("a") as log:
                log.write(f"x-kvchaos.l2_fs_size: not root, so {path} is a plain folder, not a "
                          f"{s.l2_fs_size} tmpfs; the disk_full fault will refuse to run "
                          "(run as root, or use --backend compose)\n")
            return
        self.journal.add("mount", str(path), path=str(path))
        with interrupts.deferred():  # a mount(8) cut short may still mount after down() looked
            r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={s.l2_fs_size}", "kvchaos-l2", str(path)],
                               capture_output=True, text=True)
        if r.returncode != 0:
            self.journal.remove("mount", str(path))
            raise StackError(f"could not mount a {s.l2_fs_size} tmpfs at {path}: {r.stderr.strip()}")

    def _unmount_l2(self) -> None:
        """Unmount the filesystem L2's tmpfs (every mount at ``l2_fs_path``; a busy one lazily,
        chaos/stack/mounts.py) and close its journal entry once nothing is mounted there.

        Raises:
            StackError: a mount is still there (the message names the path and umount's
                answer); the journal entry stays open for ``kvchaos cleanup``.
        """
        s = self.settings
        if not s.l2_fs_size or not s.l2_fs_path:
            return
        path = Path(s.l2_fs_path)
        left = unmount_all(path)
        if left is not None:
            raise StackError(f"could not unmount the filesystem L2: {left}")
        self.journal.remove("mount", str(path))

    def _wait_many(self, names: list[str]) -> None:
        if not names:
            return
        with ThreadPoolExecutor(max_workers=len(names)) as pool:
            futures = {n: pool.submit(self.wait_healthy, n) for n in names}
            errors = []
            for n, f in futures.items():
                try:
                    f.result()
                except StackError as exc:
                    errors.append(exc)
            if errors:
                raise errors[0]
        proxy = self.settings.proxy
        if proxy is not None and proxy.service in names:
            try:
                self.populate_links()
            except StackError as exc:  # with the proxy's last log lines
                raise StackError(str(exc), proxy.service,
                                 log_tail(self.log_dir / f"{proxy.service}.log")) from exc.__cause__

    def _spawn(self, name: str) -> _Proc:
        svc: Service = self.spec.services[name]
        argv = svc.argv("local")
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log_path = self.log_dir / f"{name}.log"
        cwd = svc.working_dir or str(Path(self.spec.path).resolve().parent)
        env = service_environment(svc.env(), base=self.env)
        # Signals held from the fork until the process is journalled and known to down().
        with interrupts.deferred(), open(log_path, "ab") as log:
            log.write(f"\n=== kvchaos: starting {name}: {argv} at {time.strftime('%H:%M:%S')} ===\n".encode())
            log.flush()
            try:
                popen = subprocess.Popen(argv, env=env, cwd=cwd, stdin=subprocess.DEVNULL, stdout=log,
                                         stderr=subprocess.STDOUT, start_new_session=True)
            except OSError as exc:
                raise StackError(f"service {name!r} did not start: {exc}", name) from exc
            ident = identity(popen.pid)
            ctime = ident.pop("create_time") or time.time()
            proc = _Proc(name, popen.pid, popen.pid, ctime, log_path, popen=popen, ident=ident)
            self.journal.add("process", f"{name}:{popen.pid}", pid=popen.pid, pgid=popen.pid,
                             create_time=ctime, **ident, service=name)
            with self._lock:
                self._procs[name] = proc
        return proc

    # --- identity: the process that answers is the one this stack started ------------------
    def own_pids(self) -> set[int]:
        """The live pids of every service's process group."""
        pids: set[int] = set()
        for p in self._procs.values():
            pids |= group_pids(p.pgid)
        return pids

    def service_pids(self, name: str) -> set[int] | None:
        """The live pids of the service's process group (None: not started)."""
        proc = self._procs.get(name)
        return None if proc is None else group_pids(proc.pgid)

    def service_log_tail(self, name: str) -> str:
        return log_tail(self.log_dir / f"{name}.log")

    def _probe_once(self, name: str) -> bool:
        if interrupts.startup_interrupted():  # the stack goes down: stop waiting (worker threads)
            raise StackError(f"start-up of {name!r} interrupted", name)
        proc = self._procs.get(name)
        if proc is None or not proc.alive():
            rc = proc.returncode if proc else None
            lost = self.lost_binds(name)
            why = f"; {'; '.join(lost)} (a lost bind)" if lost else ""
            raise StackError(f"service {name!r} exited (code {rc}) before it became healthy{why}", name,
                             log_tail(self.log_dir / f"{name}.log"), exited=proc is not None and not lost)
        hc = self.spec.services[name].healthcheck
        argv = hc.argv() if hc else None
        if argv is None:
            return True
        url = probe_url_of(argv)
        if url is not None:
            ok, _ = probe(url, timeout_s=hc.timeout)
            if ok:
                self.check_identity(name, url)
            return ok
        env = service_environment(self.spec.services[name].env(), base=self.env)
        try:
            r = subprocess.run(argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL, timeout=hc.timeout)
        except subprocess.TimeoutExpired:
            return False
        except OSError:
            return False
        return r.returncode == 0

    def wait_healthy(self, service: str, timeout_s: float | None = None) -> None:
        """Poll the service's health check until it passes.

        Raises:
            StackError: the process ended, or the deadline (``timeout_s``, default the health
                check's start_period + retries * (interval + timeout)) passed; the message carries
                the last log lines.
        """
        svc = self.spec.services[service]
        hc = svc.healthcheck
        if hc is None or hc.argv() is None:
            time.sleep(0.2)
            self._probe_once(service)  # raises if it already exited
            self._procs[service].healthy = True
            return
        deadline = timeout_s if timeout_s is not None else hc.deadline_s
        retrying = Retrying(stop=stop_after_delay(deadline), wait=wait_fixed(hc.start_interval or hc.interval),
                            retry=retry_if_result(lambda ok: not ok), retry_error_callback=lambda _s: False)
        ok = retrying(self._probe_once, service)
        if not ok:
            lost = self.foreign_listeners(service)
            why = f"; {'; '.join(lost)}" if lost else ""
            raise StackError(f"service {service!r} not healthy after {deadline:.0f}s "
                             f"(health check {hc.test}){why}", service, log_tail(self.log_dir / f"{service}.log"))
        lost = self.foreign_listeners(service)
        if lost:  # e.g. LMCache's HTTP port is ours but its RPC port another process's
            raise StackError(f"service {service!r} is healthy, but {'; '.join(lost)}: a process this stack "
                             "did not start would serve it", service, log_tail(self.log_dir / f"{service}.log"))
        self._procs[service].healthy = True

    def status(self) -> dict[str, ServiceStatus]:
        """State of each service; records exits it notices (see :attr:`exits`)."""
        out: dict[str, ServiceStatus] = {}
        with self._lock:
            for name in self.spec.services:
                p = self._procs.get(name)
                if p is None:
                    out[name] = ServiceStatus(name, "not-started")
                    continue
                alive = p.alive()
                if not alive and not p.exit_recorded:
                    p.exit_recorded = True
                    self.exits.append(ServiceExit(name, time.time(), p.returncode, p.expected_exit))
                if not alive and not p.group_alive():
                    # Whoever ended it (a fault, a crash), nothing of it is left to clean up.
                    self.journal.remove("process", f"{name}:{p.pid}")
                state = "paused" if alive and p.paused else "running" if alive else "exited"
                out[name] = ServiceStatus(name, state, p.pid, p.healthy if alive else False, p.returncode,
                                          {"log": str(p.log_path), "pgid": p.pgid})
        return out

    def _signal_group(self, p: _Proc, signum: int) -> None:
        try:
            os.killpg(p.pgid, signum)
        except ProcessLookupError:
            pass

    def _wait_gone(self, p: _Proc, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if p.popen is not None:
                p.popen.poll()
            if not p.alive() and not p.group_alive():
                return True
            time.sleep(0.05)
        return False

    def _proc(self, service: str) -> _Proc:
        if service not in self.spec.services:
            raise StackError(f"unknown service {service!r} (services: {', '.join(self.spec.services)})", service)
        p = self._procs.get(service)
        if p is None:
            raise StackError(f"service {service!r} is not started", service)
        return p

    def kill(self, service: str, sig: str | int = "SIGKILL") -> None:
        """Signal the service's process group; SIGKILL waits until the group is gone.

        Raises:
            StackError: unknown or not-started service; ValueError: unknown signal.
        """
        signum = signal_number(sig)
        p = self._proc(service)
        p.expected_exit = True
        if p.paused and signum not in (signal.SIGCONT, signal.SIGSTOP):
            self._signal_group(p, signal.SIGCONT)
            p.paused = False
        self._signal_group(p, signum)
        if signum == signal.SIGKILL:
            self._wait_gone(p, KILL_WAIT_S)
        self._after_exit(p)

    def _after_exit(self, p: _Proc) -> None:
        if not p.alive() and not p.group_alive():
            self.status()
            self.journal.remove("process", f"{p.service}:{p.pid}")

    def stop(self, service: str) -> None:
        """Graceful stop: the service's stop_signal, then SIGKILL after its grace period."""
        p = self._procs.get(service)
        if p is None:
            return
        p.expected_exit = True
        svc = self.spec.services[service]
        if p.alive() or p.group_alive():
            if p.paused:
                self._signal_group(p, signal.SIGCONT)
                p.paused = False
            self._signal_group(p, signal_number(svc.stop_signal))
            if not self._wait_gone(p, svc.stop_grace_period):
                self._signal_group(p, signal.SIGKILL)
                self._wait_gone(p, KILL_WAIT_S)
        self._after_exit(p)

    def start(self, service: str, wait: bool = True) -> None:
        """(Re)start a service that is not running; waits for health when ``wait``."""
        if service not in self.spec.services:
            raise StackError(f"unknown service {service!r}", service)
        p = self._procs.get(service)
        if p is not None and p.alive():
            return
        self._spawn(service)
        if wait:
            self.wait_healthy(service)
            if self.settings.proxy is not None and self.settings.proxy.service == service:
                self.populate_links()
        self._save_state()

    def pause(self, service: str) -> None:
        """SIGSTOP the service's process group."""
        p = self._proc(service)
        self._signal_group(p, signal.SIGSTOP)
        p.paused = True
        self.journal.add("paused", f"{service}:{p.pid}", pgid=p.pgid, pid=p.pid, create_time=p.create_time,
                         **p.ident)
        self._save_state()

    def resume(self, service: str) -> None:
        """SIGCONT the service's process group."""
        p = self._proc(service)
        self._signal_group(p, signal.SIGCONT)
        p.paused = False
        self.journal.remove("paused", f"{service}:{p.pid}")
        self._save_state()

    def down(self) -> None:
        """Stop every service (reverse dependency order), then make sure no process of any
        service's group is left, unmount the filesystem L2; removes ``state.json``.

        Raises:
            StackError: the filesystem L2 could not be unmounted (its journal entry stays
                open for ``kvchaos cleanup``); everything else was done.
        """
        order = [n for wave in reversed(self.spec.start_order()) for n in wave]
        for name in order:
            if name in self._procs:
                self.stop(name)
        for p in self._procs.values():  # belt and braces: nothing of a group may survive
            if p.group_alive():
                self._signal_group(p, signal.SIGKILL)
                self._wait_gone(p, KILL_WAIT_S)
            self.journal.remove("process", f"{p.service}:{p.pid}")
        if self._socket_dir is not None:  # sockets a killed service never unlinked (vLLM's IPC)
            shutil.rmtree(self._socket_dir, ignore_errors=True)
            self.journal.remove("file", str(self._socket_dir))
        try:
            self._unmount_l2()
        except StackError as exc:
            raise StackError(f"stack down left {exc}; {cleanup_hint(self.journal)}") from None
        finally:
            if self.state_path.exists():
                self.state_path.unlink()
            self.journal.close()

    def collect_logs(self, dest_dir: Path) -> list[Path]:
        """Copy ``logs/*.log`` into ``dest_dir``."""
        dest_dir = Path(dest_dir)
        dest_dir.mkdir(parents=True, exist_ok=True)
        out = []
        for f in sorted(self.log_dir.glob("*.log")):
            target = dest_dir / f.name
            shutil.copyfile(f, target)
            out.append(target)
        return out

    def pids(self) -> dict[str, int]:
        """``{service: pid}`` of started services."""
        return {n: p.pid for n, p in self._procs.items()}


__all__ = ["LocalStack", "signal_number", "log_tail"]
