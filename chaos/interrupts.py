"""SIGINT and SIGTERM during a run: one RunInterrupted, raised once, where it is safe.

    command start ── handling() installs one handler for SIGINT and SIGTERM (main thread)
       │  1st signal ─> RunInterrupted(signum, stage) raised in the main thread, so every
       │                ``finally`` heals, stops stacks and writes the report on the way out
       │                (held inside deferred(): raised when the block ends)
       │  later signals ─> recorded, never raised: the teardown they would cut short is what
       │                   keeps faults, processes and mounts from being left behind
    command end ──── the previous handlers come back

Inside an event loop (``run_async``, the phases and the recompute oracle) the first signal is
not raised where it lands: it cancels the loop's main task (``call_soon_threadsafe``), so the
coroutines unwind through their ``except CancelledError``/``finally`` at an ``await`` (an
in-flight request records its completion, a shielded close finishes), the loop closes, and the
RunInterrupted is raised after it. A KeyboardInterrupt raised inside a loop callback lands
between any two bytecodes of asyncio, httpx or anyio code (the Python docs, "Note on Signal
Handlers and Exceptions", warn that most code cannot be made robust against that), and one run
was seen never to come back from it (tests/compose/test_compose_run.py, SIGINT as the first
request was sent).

``deferred()`` marks the few steps an exception must not split: a process started but not yet
recorded, a heal half done, a report half written, the stacks going down. Without
``handling()`` around it (library use, tests), ``deferred()`` installs the handler for its own
duration, so a signal in it is still held and raised at its end.

Exit codes follow the shell's convention: 128 + the signal number (130 SIGINT, 143 SIGTERM).

Start-up: the ``kvchaos`` entry point (chaos/entry.py) sets one of two start-up modes as its
first instruction, before the imports that take 2-11 s, so a signal that comes while the program
still loads neither raises KeyboardInterrupt inside an import (a traceback, half-imported modules
left behind) nor kills the process silently (SIGTERM's default):

- ``kvchaos run`` (:func:`hold_startup`): the signal is held (stage "start-up") until
  :func:`end_startup`, which the run calls after its own imports and the validation, and which
  raises it as RunInterrupted, so the run writes its report with verdict ``interrupted``;
- every other command (:func:`exit_during_startup`): nothing is under way to report or undo, so
  the process says so and exits 130 / 143 at once (a stack's services are ``kvchaos`` commands
  too, and a stack brought down while they load must not wait for their imports);
  :func:`end_startup`, called before the command starts, gives the handlers back.

This module imports only light standard-library modules (asyncio only inside
:func:`run_async`), so the start-up mode is on within milliseconds.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable, Coroutine, Iterator
from contextlib import ExitStack, contextmanager
from typing import Any, TypeVar

T = TypeVar("T")

__all__ = ["RunInterrupted", "handling", "deferred", "stage", "set_stage", "current_stage", "pending",
           "as_interrupt", "startup_interrupted", "exit_on_signal", "run_async", "SIGNALS", "STARTUP_STAGES",
           "STARTUP", "SUITE_START", "hold_startup", "exit_during_startup", "end_startup", "holding_startup",
           "script_exit"]

#: The stage of a signal that came before the command started anything (imports, argument
#: parsing, validation).
STARTUP = "start-up"

#: The stage between the end of :data:`STARTUP` and the suite's first named stage (the stack pool,
#: the campaign's workers being set up).
SUITE_START = "suite start"

#: The signals a run turns into RunInterrupted.
SIGNALS = (signal.SIGINT, signal.SIGTERM)


class RunInterrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM arrived during a run (a KeyboardInterrupt, so code that already stops
    on Ctrl-C stops on SIGTERM too).

    Attributes:
        signum: the signal number; ``signal_name`` its name ("SIGTERM").
        stage: what the run was doing when it arrived ("stack start-up", "phase warm", ...).
        exit_code: 128 + signum (130 SIGINT, 143 SIGTERM).
        result: the interrupted scenario's RunResult once the runner wrote it (else None).
        results: every RunResult of the suite it stopped (set by chaos.runner.suite).
        suite_dir: the suite's report folder once it was written (else None).
    """

    def __init__(self, signum: int = signal.SIGINT, stage: str | None = None) -> None:
        self.signum = int(signum)
        self.stage = stage
        self.result: Any = None
        self.results: list[Any] = []
        self.suite_dir: Any = None
        super().__init__(self.describe())

    @property
    def signal_name(self) -> str:
        try:
            return signal.Signals(self.signum).name
        except ValueError:
            return f"signal {self.signum}"

    @property
    def exit_code(self) -> int:
        return 128 + self.signum

    def describe(self) -> str:
        """``"SIGTERM during phase warm"``."""
        return self.signal_name + (f" during {self.stage}" if self.stage else "")

    def __reduce__(self):  # pickling (pytest-xdist) keeps signal and stage
        return (RunInterrupted, (self.signum, self.stage))


class _State:
    """Process-wide (the handler runs in the main thread only)."""

    def __init__(self) -> None:
        self.installed = 0  # nesting of handling()
        self.old: dict[int, Any] = {}
        self.received: list[int] = []
        self.raised = False
        self.held = 0  # nesting of deferred()
        self.stage: str | None = None
        self.cancel: Callable[[], None] | None = None  # set by run_async while its loop runs
        self.cancelled_by: tuple[int, str | None] | None = None  # (signum, stage) run_async owes
        self.startup: ExitStack | None = None  # hold_startup()'s handling + stage + deferred
        self.after_startup: str | None = None  # the stage end_startup(then=...) hands over to
        self.startup_old: dict[int, Any] | None = None  # exit_during_startup(): the handlers it replaced


_state = _State()


def _main() -> bool:
    return threading.current_thread() is threading.main_thread()


def _handler(signum: int, _frame: object) -> None:
    st = _state
    st.received.append(signum)
    if st.cancel is not None:  # an event loop runs: cancel its main task, raise after the loop
        if st.raised:
            _say(f"kvchaos: {signal.Signals(signum).name} received; still healing faults and stopping the "
                 "stacks (SIGKILL skips that; then run `kvchaos cleanup`)\n")
        else:
            st.raised = True
            st.cancelled_by = (signum, st.stage)
        st.cancel()  # again on a later signal: a cancellation swallowed on the way is retried
        return
    if st.raised or st.held:
        if st.startup is not None and not st.raised and len(st.received) == 1:
            _say(f"kvchaos: {signal.Signals(signum).name} received during start-up; stopping once loaded "
                 "(the report says so)\n")
        if st.raised and len(st.received) > 1:
            _say(f"kvchaos: {signal.Signals(signum).name} received; still healing faults and stopping the "
                 "stacks (SIGKILL skips that; then run `kvchaos cleanup`)\n")
        return
    st.raised = True
    raise RunInterrupted(signum, st.stage)


def _say(text: str) -> None:
    try:
        os.write(2, text.encode())  # not print(): a signal handler may interrupt a print
    except OSError:
        pass


@contextmanager
def handling() -> Iterator[None]:
    """Inside the block (main thread), the first SIGINT or SIGTERM raises RunInterrupted; later
    ones are recorded only. A signal ignored (SIG_IGN) when the outermost block starts stays
    ignored. Nested blocks share the outermost's state; outside the main thread this does
    nothing."""
    if not _main():
        yield
        return
    st = _state
    if st.installed == 0:
        st.received.clear()
        st.raised = False
        st.cancelled_by = None
        # A signal the parent set to be ignored stays ignored (a job started with `&` by a
        # non-interactive shell ignores SIGINT; Python itself keeps that too).
        st.old = {sig: signal.signal(sig, _handler) for sig in SIGNALS
                  if signal.getsignal(sig) is not signal.SIG_IGN}
    st.installed += 1
    try:
        yield
    finally:
        st.installed -= 1
        if st.installed == 0:
            for sig, old in st.old.items():
                signal.signal(sig, old)
            st.old = {}
            st.held = 0
            st.stage = None


@contextmanager
def deferred() -> Iterator[None]:
    """Inside the block (main thread), SIGINT and SIGTERM are held; the first one, unless a
    RunInterrupted was raised already, is raised as RunInterrupted when the block ends (also
    when it ends by another exception: that one is then chained as its context). Outside the
    main thread this does nothing (signals interrupt the main thread only)."""
    if not _main():
        yield
        return
    with handling():
        st = _state
        before = len(st.received)
        st.held += 1
        try:
            yield
        finally:
            st.held -= 1
            if not st.held and not st.raised and len(st.received) > before:
                st.raised = True
                raise RunInterrupted(st.received[before], st.stage)


def run_async(main: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run(main)`` where a signal cancels instead of raising inside the loop.

    Inside :func:`handling` (main thread), the first SIGINT or SIGTERM while the loop runs
    cancels ``main``'s task (scheduled with ``call_soon_threadsafe``, as asyncio.Runner does
    for SIGINT); once ``asyncio.run`` has returned (tasks done, the default executor's threads
    joined, the loop closed) the RunInterrupted is raised here, with the stage the signal came
    in. Later signals cancel again (a cancellation swallowed on the way) and are never raised.
    Outside handling() (library use) this is plain ``asyncio.run``.

    Returns:
        what ``main`` returned, when no signal came.

    Raises:
        RunInterrupted: a signal came while the loop ran (also when ``main`` had just finished).
        Whatever ``main`` raised, else.
    """
    import asyncio  # here, not at the top: the entry point's hold_startup() imports this module first

    st = _state
    if not _main() or not st.installed or st.cancel is not None:
        return asyncio.run(main)
    box: dict[str, Any] = {}

    def cancel() -> None:
        loop, task = box.get("loop"), box.get("task")
        if loop is None or task is None:
            return  # the loop has not started main yet: wrapper() sees cancelled_by
        try:
            loop.call_soon_threadsafe(lambda: task.done() or task.cancel())
        except RuntimeError:  # the loop closed in the meantime
            pass

    async def wrapper() -> T:
        box["task"], box["loop"] = asyncio.current_task(), asyncio.get_running_loop()
        if st.cancelled_by is not None:
            main.close()
            raise asyncio.CancelledError
        return await main

    st.cancel = cancel
    result: Any = None
    try:
        result = asyncio.run(wrapper())
    except asyncio.CancelledError:
        if st.cancelled_by is None:
            raise
    finally:
        st.cancel = None
        owed, st.cancelled_by = st.cancelled_by, None
        if owed is not None:
            raise RunInterrupted(*owed)
    return result


def hold_startup() -> None:
    """From the first instruction of the entry point: install the handler (as :func:`handling`),
    hold SIGINT and SIGTERM (as :func:`deferred`) and name the stage :data:`STARTUP`, until
    :func:`end_startup`. A signal ignored by the parent stays ignored. Does nothing outside the
    main thread or when a hold is on already."""
    st = _state
    if not _main() or st.startup is not None:
        return
    hold = ExitStack()
    hold.enter_context(handling())
    before = set_stage(STARTUP)
    # On close the stage goes straight to what end_startup(then=...) names: no instant in which
    # a signal would find no stage at all (the input that showed it: a SIGINT 2.5 s into
    # `kvchaos run`, after the validation, gave a suite report with no stage).
    hold.callback(lambda: set_stage(st.after_startup if st.after_startup is not None else before))
    hold.enter_context(deferred())
    st.startup = hold


def _exit_at_startup(signum: int, _frame: object) -> None:
    _say(f"interrupted ({signal.Signals(signum).name} during {STARTUP})\n")
    os._exit(128 + signum)  # nothing started yet: no buffer, file or process to see to


def exit_during_startup() -> None:
    """From the first instruction of the entry point of a command that writes no report: a
    SIGINT or SIGTERM before :func:`end_startup` prints ``interrupted (SIGTERM during
    start-up)`` and exits 128 + the signal at once. Ignored signals stay ignored; main thread
    only; nothing when a start-up mode is on already."""
    st = _state
    if not _main() or st.startup is not None or st.startup_old is not None:
        return
    st.startup_old = {sig: signal.signal(sig, _exit_at_startup) for sig in SIGNALS
                      if signal.getsignal(sig) is not signal.SIG_IGN}


def holding_startup() -> bool:
    """True while :func:`hold_startup`'s hold is on."""
    return _state.startup is not None


def end_startup(then: str | None = None) -> None:
    """End the start-up mode (nothing when none is on). :func:`hold_startup`'s: the handlers the
    process had before come back unless a :func:`handling` block that started meanwhile keeps
    this module's; :func:`exit_during_startup`'s: the handlers it replaced come back.

    Args:
        then: the stage the run is in from the moment the hold ends (None: the stage it had
            before :func:`hold_startup`), so that a signal right after it still names one.

    Raises:
        RunInterrupted: a signal came while the hold was on (stage :data:`STARTUP`); raised
            once, so the caller can write its report with signals held.
    """
    st = _state
    old, st.startup_old = st.startup_old, None
    for sig, handler in (old or {}).items():
        signal.signal(sig, handler)
    hold, st.startup = st.startup, None
    if hold is not None:
        st.after_startup = then
        try:
            hold.close()
        finally:
            st.after_startup = None


def _exit_now(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)


def exit_on_signal() -> None:
    """From now on (main thread), SIGINT or SIGTERM ends the process with 128 + the signal at
    once: for a command whose run is over (report written, stacks down) and that only has to
    exit, so a signal in its last instants still gives 130 / 143. Ignored signals stay ignored."""
    if not _main():
        return
    for sig in SIGNALS:
        if signal.getsignal(sig) is not signal.SIG_IGN:
            signal.signal(sig, _exit_now)


def set_stage(name: str | None) -> str | None:
    """Name what the run does now (shown in RunInterrupted); returns the previous name."""
    old, _state.stage = _state.stage, name
    return old


def current_stage() -> str | None:
    """What :func:`set_stage` last named (None outside a run)."""
    return _state.stage


@contextmanager
def stage(name: str) -> Iterator[None]:
    """:func:`set_stage` for the block; the previous stage comes back after it."""
    old = set_stage(name)
    try:
        yield
    finally:
        set_stage(old)


#: Stages whose waits (health checks in worker threads) end once a signal came: a stack that
#: is starting is brought down anyway. (A heal that restarts a service still waits for it.)
STARTUP_STAGES = ("stack start-up", "stack restart")


def pending() -> int | None:
    """The first signal received inside :func:`handling` (any thread may ask), else None."""
    got = _state.received
    return got[0] if got and _state.installed else None


def startup_interrupted() -> bool:
    """True once a signal came while a stack starts (:data:`STARTUP_STAGES`): health-check
    waits in worker threads end, so the stack goes down at once."""
    return pending() is not None and _state.stage in STARTUP_STAGES


def as_interrupt(exc: BaseException) -> RunInterrupted:
    """``exc`` as a RunInterrupted: itself, or a plain KeyboardInterrupt (Python's own SIGINT
    handler, outside :func:`handling`) as SIGINT at the current stage."""
    if isinstance(exc, RunInterrupted):
        return exc
    out = RunInterrupted(signal.SIGINT, _state.stage)
    out.__cause__ = exc
    return out


def dump_stacks_on_sigusr1() -> None:
    """``kill -USR1 <pid>`` makes this process print every thread's Python stack to stderr
    (faulthandler, which writes from the C signal handler, so it answers even when the main
    thread is stuck); the run goes on. For a run that seems hung: where it waits, in one signal.
    A SIGUSR1 handler someone else installed is kept. A fatal signal (SIGSEGV, SIGABRT, ...)
    prints the stacks too (faulthandler.enable) before the process dies."""
    import faulthandler
    import signal

    faulthandler.enable(all_threads=True)
    if signal.getsignal(signal.SIGUSR1) is signal.SIG_DFL:
        faulthandler.register(signal.SIGUSR1, all_threads=True)


def script_exit(main: Callable[[], int], name: str) -> None:
    """A script's entry (benchmarks/): ``main()`` inside :func:`handling`, so a SIGINT or SIGTERM
    unwinds its ``finally`` blocks (stacks stopped, faults healed); raises SystemExit with
    main's code, or 128 + signal number with one line on stderr naming ``name`` and the signal."""
    import sys

    try:
        with handling():
            code = main()
    except RunInterrupted as exc:
        print(f"{name}: {exc.describe()}; what it started was stopped", file=sys.stderr)
        raise SystemExit(exc.exit_code) from None
    raise SystemExit(code)
