"""Stacks shared by the scenarios of a suite: one per stack file (and backend), reused.

Starting the reference stack costs tens of seconds (two engines load a model, LMCache starts);
a suite reuses it, and between scenarios puts it back to a known state so that no scenario
sees another's cache or faults:

1. services a fault stopped are started again, paused ones resumed;
2. the proxy is reset (Toxiproxy ``POST /reset``: every toxic removed, every proxy enabled) and
   the links are created again;
3. LMCache's L1 is cleared (``POST /cache/clear`` of the MP server's HTTP API), the Redis L2
   flushed (``FLUSHALL``) and the filesystem L2 emptied;
4. the engine's local prefix cache is reset (``POST /reset_prefix_cache``, vLLM's route);
5. on an engine with stall hooks (capability ``engine.hooks.stall``), the stalls still pending
   at each point are cleared: a raw ``hook`` fault that armed more holds than its requests
   used must not hold the next scenario's requests.

A scenario whose stack variables differ from the previous one's (its ``variables``, and its
engine options ``engine.bugs``/``engine.prefix_caching`` as ``KVCHAOS_ENGINE_BUGS``/
``KVCHAOS_ENGINE_PREFIX_CACHING``) gets exactly the services whose command or environment
changed restarted; the rest of the stack stays up.
"""

from __future__ import annotations

import shutil
from contextlib import contextmanager
from collections.abc import Callable
from pathlib import Path

import httpx

from chaos import interrupts
from chaos.httppool import ssl_context
from chaos.stack.base import Stack, StackError, new_run_id
from chaos.yamlsource import ConfigError


@contextmanager
def interrupts_deferred():
    """Inside the block, SIGINT and SIGTERM are held (main thread only); the first one held is
    raised as RunInterrupted (a KeyboardInterrupt) "during teardown" when the block ends, unless
    one was raised already (chaos/interrupts.py)."""
    with interrupts.stage("teardown"), interrupts.deferred():
        yield


def make_stack(stack_file: Path, backend: str, run_dir: Path, environ: dict[str, str] | None = None) -> Stack:
    """A (not yet started) stack of ``backend`` ("local" or "compose") for ``stack_file``.

    Raises:
        ConfigError: the stack file is invalid; ValueError: unknown backend.
    """
    if backend == "local":
        from chaos.stack.local import LocalStack

        return LocalStack(stack_file, run_dir=run_dir, environ=environ)
    if backend == "compose":
        from chaos.stack.compose import ComposeStack

        return ComposeStack(stack_file, run_dir=run_dir, environ=environ)
    raise ValueError(f"unknown backend {backend!r} (use local or compose)")


def reset_stack(stack: Stack, say: Callable[[str], None] = lambda _m: None) -> None:
    """Put a running stack back to a clean state between scenarios (see the module doc).

    Raises:
        StackError: a service could not be started again, or an API of the stack failed.
    """
    touched: list[str] = []
    for name, st in stack.status().items():
        if st.state == "paused":
            stack.resume(name)
            touched.append(name)
        elif st.state in ("exited", "not-started"):
            say(f"restarting {name}")
            stack.start(name)
            touched.append(name)
    if stack.engine_under_lmcache(touched):
        back = stack.wait_engine_reconnected(None)
        if not back["reconnected"]:
            say(f"the engine did not reconnect to LMCache within {back['waited_s']:.0f}s")
    from chaos.proxy.client import ToxiproxyError

    s = stack.settings
    try:
        with httpx.Client(timeout=10, verify=ssl_context()) as http:
            if s.proxy is not None:
                from chaos.proxy.client import ToxiproxyClient

                with ToxiproxyClient(s.proxy.api) as proxy:
                    proxy.reset()
                stack.populate_links()
            if s.lmcache_http:
                http.post(f"{s.lmcache_http}/cache/clear").raise_for_status()
            if s.engine_url:
                r = http.post(f"{s.engine_url}/reset_prefix_cache")
                if r.status_code != 404:  # an engine without a local prefix cache has no route
                    r.raise_for_status()
                if "engine.hooks.stall" in stack.spec.capabilities():
                    from chaos.faults.stall import STALL_POINTS, arm_stall

                    for point in STALL_POINTS:  # 0 s: the engine drops what is pending
                        arm_stall(s.engine_url, point, 0, 1)
    except httpx.HTTPError as exc:
        raise StackError(f"could not reset the stack between scenarios: {exc}") from exc
    except ToxiproxyError as exc:
        raise StackError(f"could not reset the stack's proxy between scenarios: {exc}",
                         s.proxy.service if s.proxy else None) from exc
    if s.redis is not None:
        import redis

        try:
            redis.Redis.from_url(s.redis.url, socket_timeout=10).flushall()
        except redis.RedisError as exc:
            raise StackError(f"could not flush the Redis L2 at {s.redis.url}: {exc}", s.redis.service) from exc
    if s.l2_fs_path and Path(s.l2_fs_path).is_dir():
        for child in Path(s.l2_fs_path).iterdir():
            if child.is_dir() and not child.is_mount():
                shutil.rmtree(child, ignore_errors=True)
            elif child.is_file():
                child.unlink(missing_ok=True)


#: Fault kinds that stop, freeze or restart a service: the next scenario gets a fresh stack.
DISRUPTIVE_KINDS = ("kill", "pause", "retrieve_fail", "l2_fault_inject")


def oracle_side(stack: Stack, result) -> list[str]:
    """The services of the stack's recompute oracle that may stay up while the rest of the stack
    starts afresh after ``result``'s scenario disrupted it: the recompute twin
    (``x-kvchaos.recompute``) and its witness LMCache (``x-kvchaos.witness.service``).

    They are not the system under test: the twin has no cache to load from (no connector that
    loads, no prefix cache), so its output is a function of the prompt, and the witness only
    holds what the twin stored; between clean scenarios they are reused as they are. Restarting
    them after a scenario that killed or froze LMCache, Redis or the engine cost every such
    scenario a twin start (a model load) and an LMCache start. Kept only while that holds:

    - the backend is the local one (``docker compose`` brings a stack up as a whole);
    - no fault of the scenario names the service (any parameter value equal to its name);
    - it is running, and it does not depend (``service_healthy``) on a service that restarts.

    Args:
        stack: the pool's stack for the scenario's stack file.
        result: the scenario's RunResult (its ``faults`` and their ``params``).

    Returns:
        The names of the services that may stay up (empty: restart it all).
    """
    settings = stack.settings
    names = [settings.recompute, settings.witness.service if settings.witness is not None else None]
    wanted = [n for n in names if n and n in stack.spec.services]
    if stack.backend != "local" or not wanted:
        return []
    named = {v for f in result.faults for v in _strings(f.params)}
    status = stack.status()
    kept = [n for n in wanted if n not in named and status.get(n) is not None and status[n].state == "running"]
    changed = True
    while changed:  # drop any whose health rests on a service that restarts
        changed = False
        for n in list(kept):
            deps = stack.spec.services[n].dependencies()
            if any(c == "service_healthy" and d not in kept for d, c in deps.items()):
                kept.remove(n)
                changed = True
    return kept


def _strings(value) -> list[str]:
    """Every string inside a JSON-like value (dict values, list items)."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for v in value.values() for s in _strings(v)]
    if isinstance(value, (list, tuple)):
        return [s for v in value for s in _strings(v)]
    return []


class StackPool:
    """Stacks of a suite, keyed by stack file; started on first use, reset on reuse.

    Args:
        backend: "local" or "compose".
        root: folder for the stacks' run dirs (logs, L2 files).
        keep: leave the stacks running at :meth:`close` (``--keep-stack``).
    """

    def __init__(self, backend: str, root: Path, keep: bool = False) -> None:
        self.backend = backend
        self.root = Path(root)
        self.keep = keep
        self._stacks: dict[Path, Stack] = {}
        self._variables: dict[Path, dict[str, str]] = {}
        self._used: set[Path] = set()
        self._dirty: set[Path] = set()
        #: dirty stacks whose recompute oracle (twin and witness) may stay up through the restart
        self._oracle_kept: dict[Path, list[str]] = {}
        #: stacks whose engine served wrong outputs: the next scenario gets the engine restarted
        self._engine_dirty: set[Path] = set()
        #: what bringing a stack down could not undo (a container, a mount), one line each, with
        #: who undoes it; the journal keeps it for ``kvchaos cleanup``
        self.teardown_errors: list[str] = []

    def acquire(self, stack_file: Path, variables: dict[str, str] | None = None,
                say: Callable[[str], None] = lambda _m: None) -> Stack:
        """The running stack for ``stack_file``, started with ``variables`` (engine options,
        see :meth:`chaos.scenario.model.EngineOptions.stack_variables`), clean.

        Raises:
            ConfigError: invalid stack file; StackError: it could not be built, started, restarted
            or reset, whatever failed (a port variable another kvchaos stack claims, no free port
            to claim, an unwritable claims folder, a service that did not start: any exception
            but ConfigError arrives as a StackError naming it, so that every caller reports an
            infrastructure error with the report written, never a traceback); a stack of the pool
            that failed so is started afresh for the next scenario; RunInterrupted: a signal came
            meanwhile (the stack is known to the pool, so :meth:`close` brings down whatever of
            it started).
        """
        key = Path(stack_file).resolve()
        try:
            return self._acquire(key, dict(variables or {}), say)
        except (StackError, ConfigError):
            self._fail(key)
            raise
        except Exception as exc:
            self._fail(key)
            raise StackError(f"could not prepare the stack {key.name}: {type(exc).__name__}: {exc}") from exc

    def _fail(self, key: Path) -> None:
        """A stack of the pool whose restart or reset failed midway: the next scenario gets it
        started afresh (all of it)."""
        if key in self._stacks:
            self._dirty.add(key)
            self._oracle_kept.pop(key, None)

    def _acquire(self, key: Path, variables: dict[str, str], say: Callable[[str], None]) -> Stack:
        import os

        stack = self._stacks.get(key)
        if stack is None:
            self._engine_dirty.discard(key)
            run_dir = self.root / new_run_id(key.stem)
            stack = make_stack(key, self.backend, run_dir, dict(os.environ, **variables))
            say(f"starting stack {key.name} ({self.backend})")
            self._stacks[key] = stack
            self._variables[key] = variables
            interrupts.set_stage("stack start-up")
            self._up_or_forget(key, stack)
            self._used.add(key)
            return stack
        if key in self._dirty:
            interrupts.set_stage("stack restart")
            self._dirty.discard(key)
            self._engine_dirty.discard(key)
            kept = self._oracle_kept.pop(key, [])
            unset = {k: os.environ.get(k, "") for k in self._variables[key] if k not in variables}
            if kept:
                say(f"restarting stack {key.name} but {', '.join(kept)} (the recompute oracle, which no "
                    "fault touched): the previous scenario disrupted it")
                # The stack's environment holds the new variables once reconfigure set them, even
                # when the restart then fails: recorded first (see below).
                self._variables[key] = variables
                stack.reconfigure({**unset, **variables}, restart=[n for n in stack.spec.services if n not in kept])
                reset_stack(stack, say)  # the filesystem L2 stays mounted: emptied here
                return stack
            say(f"restarting stack {key.name}: the previous scenario disrupted it")
            stack.down()
            stack.set_variables({**unset, **variables})
            self._variables[key] = variables
            self._up_or_forget(key, stack)
            return stack
        engine = stack.settings.engine if key in self._engine_dirty else None
        self._engine_dirty.discard(key)
        if self._variables[key] != variables or engine:
            changed = {k: v for k, v in variables.items() if self._variables[key].get(k) != v}
            # A variable the previous scenario set and this one does not goes back to its default.
            unset = {k: os.environ.get(k, "") for k in self._variables[key] if k not in variables}
            interrupts.set_stage("stack restart")
            # The stack's environment holds the new variables once reconfigure set them, even when
            # the restart then fails: recorded first, so that the next scenario unsets them.
            self._variables[key] = variables
            restarted = stack.reconfigure({**unset, **variables}, restart=[engine] if engine else None)
            why = [f"stack variables {changed or unset}"] if changed or unset else []
            why += ["the previous scenario served wrong outputs"] if engine else []
            say(f"{' and '.join(why)}: restarted {', '.join(restarted) or 'nothing'}")
        if key in self._used:
            say("resetting the stack")
            interrupts.set_stage("stack reset")
            reset_stack(stack, say)
        self._used.add(key)
        return stack

    def _up_or_forget(self, key: Path, stack: Stack) -> None:
        """``stack.up()``; when it fails, the stack leaves the pool (brought down), so the next
        scenario starts a fresh one instead of running against a stack that never came up
        (its checks would report the missing stack as the system's failure)."""
        try:
            stack.up()
        except BaseException as exc:
            self._stacks.pop(key, None)
            self._variables.pop(key, None)
            self._used.discard(key)
            try:
                stack.down()  # again: up() brought it down, and what that left may go now
            except StackError as left:
                self.teardown_errors.append(str(left))
            except Exception as left:
                self.teardown_errors.append(f"stack {key.name}: {type(left).__name__}: {left}")
            stack.release_ports()  # a new stack of this process may set them (its own variables)
            raise

    def release(self, stack_file: Path, result) -> None:
        """Tell the pool how the scenario that used the stack ended. After a scenario that
        stopped, froze or restarted a process (``DISRUPTIVE_KINDS``), left something held (its ``leaks``
        check did not pass) or could not finish, the next scenario gets a freshly started stack: a
        server that came back from a kill may be healthy yet broken in ways a reset cannot see
        (LMCache 0.5.6's Redis adapter never reconnects after Redis restarts), and leaked sessions
        would fail every later scenario's leak check. After one that served wrong outputs (its
        ``recompute_equivalence`` failed) and did none of that, the next scenario gets the engine
        restarted (the reset clears LMCache's tiers, whose copies may be wrong too): wrong KV an
        engine loaded stays in its freed blocks, where it can reach later requests (vLLM CPU 0.32:
        after l2-bitflip-served-as-kv, two cold misses of the next scenario on the same stack
        generated token 0 from their fifth token on); the rest of the stack holds nothing of it,
        and restarting it all cost every caught bug a whole stack start (twin, two LMCache
        servers, Redis, the proxy). A fresh stack for a disrupted (or leaky) scenario keeps its
        recompute oracle running where :func:`oracle_side` allows (no fault touched it, and the run
        ended without an error): every service the system under test consists of starts afresh.

        Args:
            stack_file: the scenario's stack file.
            result: the scenario's RunResult (chaos/report/model.py).
        """
        key = Path(stack_file).resolve()
        disruptive = any(f.kind in DISRUPTIVE_KINDS for f in result.faults)
        leaky = any(c.name == "leaks" and c.verdict != "passed" for c in result.checks)
        wrong = any(c.name == "recompute_equivalence" and c.verdict == "failed" for c in result.checks)
        if disruptive or leaky or result.error:
            self._dirty.add(key)
            stack = self._stacks.get(key)
            kept = oracle_side(stack, result) if stack is not None and not result.error else []
            if kept:
                self._oracle_kept[key] = kept
            else:
                self._oracle_kept.pop(key, None)
        elif wrong:
            self._engine_dirty.add(key)

    def keep_only(self, stack_file: Path | None) -> list[Path]:
        """Bring down every stack of the pool but ``stack_file``'s (None: every stack; unless
        ``keep``), so that a campaign worker moving to another stack file holds one stack at a
        time (its memory is what :func:`chaos.campaign.default_jobs` counts), and the pool stays
        usable (a later acquire starts afresh). Returns the stack files brought down. Signals are
        held until it is done, as in :meth:`close`; what a teardown could not undo is raised by
        :meth:`close` or :meth:`raise_teardown_errors`."""
        if self.keep:
            return []
        key = Path(stack_file).resolve() if stack_file is not None else None
        gone = [k for k in self._stacks if k != key]
        with interrupts_deferred():
            for k in gone:
                stack = self._stacks.pop(k)
                self._variables.pop(k, None)
                self._used.discard(k)
                self._dirty.discard(k)
                self._oracle_kept.pop(k, None)
                self._engine_dirty.discard(k)
                self._down(stack)
        return gone

    def raise_teardown_errors(self) -> None:
        """Raise what bringing stacks down could not undo (once: the list is emptied).

        Raises:
            StackError: one line per thing left (a container, a mounted filesystem L2), each
                naming who undoes it (``kvchaos cleanup``, from the run's journal).
        """
        left, self.teardown_errors = self.teardown_errors, []
        if left:
            raise StackError("; ".join(left))

    def _down(self, stack: Stack) -> None:
        """``stack.down()`` and its port claims dropped; what the teardown could not undo goes
        to :attr:`teardown_errors` (never raised: the other stacks still go down)."""
        try:
            stack.down()
        except Exception as exc:
            self.teardown_errors.append(str(exc) if isinstance(exc, StackError)
                                        else f"stack {Path(stack.spec.path).name}: {type(exc).__name__}: {exc}")
        finally:
            stack.release_ports()  # a later pool of this process may set the same ports

    def close(self) -> None:
        """Bring every stack down and drop its port claims (unless ``keep``). A second Ctrl-C or
        SIGTERM while this runs is held back until it is done: an impatient user must not leave
        processes behind. A stack that could not be brought down whole does not stop the others.

        Raises:
            StackError: what the stacks' teardowns (and those of stacks that failed to start)
                could not undo, once every stack was brought down.
        """
        if self.keep:
            return
        with interrupts_deferred():
            for stack in self._stacks.values():
                self._down(stack)
            self._stacks.clear()
            self.raise_teardown_errors()
