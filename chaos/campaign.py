"""The campaign: many scenario runs over a pool of isolated stacks, serial or in parallel.

    validated runs (scenario + its variables, engine bugs, proxy; a per-run budget)
      └─> jobs == 1: chaos.runner.suite.run_suite (one process, one StackPool)
      └─> jobs > 1:  N worker processes (``python -c 'chaos.campaign.worker_main()'``), each with
                     its own StackPool, fed one run at a time (dynamic scheduling):
            parent ──pickle──> worker k: run i ──> run_in_pool ──> report ──pickle──> parent
            an idle worker takes the first pending run whose stack (file and variables) its pool
            already holds, else one on a stack file it holds (services restarted as needed),
            else the first pending run
      └─> results in the runs' order ─> suite.json + junit.xml (one suite for every worker)

A stream (:func:`run_stream`, `kvchaos explore --jobs N`): the runs are not known beforehand; an
idle worker with nothing pending gets the next run from the caller's ``feed`` (None: no more),
and the caller's ``on_result`` sees each result as it comes (in this process, outside the
signal-held sections, so a long step there, a shrink, can still be interrupted).

Isolation: each worker's stacks claim their ports host-wide (chaos/stack/ports.py), so N stacks
of one stack file run side by side; between runs a worker's pool resets its stack, and starts it
afresh after a run that disrupted it (chaos/runner/stacks.py).

Signals: workers run in sessions of their own, so a signal reaches them only through the
parent: SIGINT or SIGTERM to the parent (``kill PID``, or a terminal's Ctrl-C to its process
group) is forwarded once to every worker; each heals its faults, writes its run's report with
verdict ``interrupted``, sends it and brings its stacks down; the parent waits for them (at most
``drain_s``; a worker still running then is killed and its journals undone as ``kvchaos
cleanup`` would), writes the suite report and raises RunInterrupted (exit 130 / 143). A worker
whose parent dies (even by SIGKILL) gets SIGTERM from the kernel (``PR_SET_PDEATHSIG``) and
does the same. A worker that dies unexpectedly: its run gets an infrastructure-error result
naming it, what its journals hold is undone, a new worker takes its place, the others go on.

The default number of workers (``--jobs auto``): :func:`default_jobs`.
"""

from __future__ import annotations

import os
import pickle
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from chaos import interrupts
from chaos.interrupts import RunInterrupted
from chaos.report.model import InterruptInfo, RunResult
from chaos.report.suite import write_suite
from chaos.runner.stacks import DISRUPTIVE_KINDS, StackPool
from chaos.runner.suite import (SuiteOptions, close_pool, infra_error_result, interrupted_result, prepare_run,
                                result_after_interrupt, run_in_pool, run_suite)
from chaos.scenario.model import Scenario
from chaos.stack.base import new_run_id

#: Resident memory of one reference stack (compose/reference.yml: the engine and its recompute
#: twin, two LMCache processes, Redis, the bundled proxy) plus the runner that drives it: the
#: peak of the process tree's summed RSS (psutil, shared pages counted in each process, so an
#: upper bound) during `kvchaos run scenarios/smoke.yaml` on the 2-core development host: 2.95
#: GiB (the LMCache server 0.9, the second LMCache process 0.6, each engine 0.6-0.7, the runner
#: 0.08, Redis 0.03). README "Parallel runs". Used by :func:`default_jobs`.
STACK_RSS_BYTES = 3 * 2**30

#: Fraction of the memory available when the campaign starts that its stacks may take.
MEMORY_SHARE = 0.75

#: Seconds the parent waits, after a signal, for its workers to heal, report and stop stacks.
DRAIN_S = 300.0


@dataclass
class CampaignRun:
    """One run of a campaign.

    Attributes:
        scenario: a validated scenario (chaos.runner.suite.load_and_validate); the suite's
            overrides (seed, bugs, numerics, equivalence) are applied to it before it runs.
        timeout_s: this run's deadline for its phases (its budget); None: the suite's.
    """

    scenario: Scenario
    timeout_s: float | None = None


def default_jobs(cpus: int | None = None, available_bytes: int | None = None,
                 stack_bytes: int = STACK_RSS_BYTES) -> int:
    """How many stacks to run at once on this host: ``min(cpus + 1, floor(MEMORY_SHARE *
    available / stack_bytes))``, at least 1.

    One more stack than cores: a scenario spends most of its time in fault windows, quiesce
    waits and stack start-ups' health-check polls, not on a CPU (benchmarks/parallel_catalogue.py
    measures it). Memory bounds it hard: a stack that swaps makes every timing check lie.

    Args:
        cpus: cores (default ``os.cpu_count()``).
        available_bytes: memory available now (default psutil's ``virtual_memory().available``).
        stack_bytes: resident memory of one stack and its worker (:data:`STACK_RSS_BYTES`).
    """
    if cpus is None:
        cpus = os.cpu_count() or 1
    if available_bytes is None:
        import psutil

        available_bytes = psutil.virtual_memory().available
    by_memory = int(MEMORY_SHARE * available_bytes // max(1, stack_bytes))
    return max(1, min(cpus + 1, by_memory))


def parse_jobs(text: str) -> int:
    """``--jobs``'s value: a whole number >= 1, or ``auto`` (:func:`default_jobs`).

    Raises:
        ValueError: anything else, with a message naming the option.
    """
    if text.strip().lower() == "auto":
        return default_jobs()
    try:
        n = int(text)
    except ValueError:
        raise ValueError(f"--jobs must be a whole number >= 1 or auto, not {text!r}") from None
    if n < 1:
        raise ValueError(f"--jobs must be a whole number >= 1 or auto, not {text!r}")
    return n


def leaves_stack_dirty(scenario: Scenario) -> bool:
    """Whether a run of ``scenario`` makes its pool start the stack afresh for the next run
    (:meth:`chaos.runner.stacks.StackPool.release`) whatever its verdict: a fault of a kind in
    ``DISRUPTIVE_KINDS`` (a kill, a pause, ...), or an expected failure on this stack
    (``xfail`` where it applies) of the ``leaks`` check, named or implied (no ``checks``)."""
    if any(f.kind in DISRUPTIVE_KINDS for phase in scenario.phases for f in phase.faults):
        return True
    x = scenario.expected_failure
    return x is not None and (x.checks is None or "leaks" in x.checks)


def one_pool_order(scenarios: Sequence[Scenario]) -> list[int]:
    """The order in which one pool (``jobs`` 1) starts vLLM-like engines the fewest times.

    A pool restarts the services a run's stack variables change (a planted bug, a pool size:
    1-3 minutes for a vLLM here) and starts the whole stack afresh after a run that leaves it
    dirty (:func:`leaves_stack_dirty`). So runs are grouped by stack file and variables (groups
    in order of first appearance, runs in their given order within a group), and a group's
    dirty runs come after its other runs: a group with ``d`` dirty runs then costs ``max(1,
    d)`` starts or restarts, the fewest any order gives, where interleaving groups costs one
    per change (`make vllm-tier`: 5 instead of 7).

    Args:
        scenarios: validated scenarios, with their run's overrides (bugs, variables) applied.

    Returns:
        a permutation of ``range(len(scenarios))``: the index of the run to go first, ...
    """
    groups: dict[tuple, list[int]] = {}
    for i, sc in enumerate(scenarios):
        key = (str(Path(sc.stack).resolve()), tuple(sorted(sc.stack_variables().items())))
        groups.setdefault(key, []).append(i)
    return [i for members in groups.values()
            for i in sorted(members, key=lambda j: leaves_stack_dirty(scenarios[j]))]


def run_campaign(runs: Sequence[Scenario | CampaignRun], opts: SuiteOptions, jobs: int = 1,
                 say: Callable[[str], None] = lambda _m: None) -> tuple[list[RunResult], Path]:
    """Run validated scenarios over pools of stacks, ``jobs`` at a time.

    Args:
        runs: scenarios (or CampaignRuns with their own budgets), validated: nothing here
            validates, so a bad file must have stopped the caller before (exit 2).
        opts: the suite's options (backend, report_dir, keep_stack, overrides, timeout_s).
        jobs: worker processes; 1 runs :func:`chaos.runner.suite.run_suite` in this process.
        say: progress lines (each prefixed ``[scenario]`` when about one run).

    Returns:
        ``(results, suite_dir)`` as run_suite: results in the order of ``runs``, each run's
        report in ``report_dir/<run_id>/``, the suite's in ``suite_dir``.

    Raises:
        RunInterrupted: SIGINT or SIGTERM at any point; every run under way was healed and
            reported (``interrupted``), every stack is down, the suite report is written;
            ``.results`` and ``.suite_dir`` as run_suite's.
    """
    items = [r if isinstance(r, CampaignRun) else CampaignRun(r) for r in runs]
    if jobs <= 1 or len(items) <= 1:
        if all(r.timeout_s is None for r in items):
            return run_suite([r.scenario for r in items], opts, say)
    return _Campaign(items, opts, max(1, min(jobs, len(items))), say).run()


#: A campaign worker's way of running one prepared run on its pool: :func:`run_in_pool`'s
#: signature and contract (``box["result"]`` set once the runner returned; the report written).
RunFn = Callable[..., RunResult]


def run_stream(feed: Callable[[], CampaignRun | None], on_result: Callable[[int, RunResult], None],
               opts: SuiteOptions, jobs: int, run_fn: RunFn | None = None,
               say: Callable[[str], None] = lambda _m: None) -> tuple[list[RunResult], Path]:
    """Run scenarios the caller generates as it goes, ``jobs`` worker processes at a time,
    each worker with its own StackPool (as :func:`run_campaign` with jobs > 1).

    Args:
        feed: called (in this process) when a worker is idle and no run is pending: the next
            run, validated, or None when there are no more (the worker then stops; runs under
            way on the others finish). It must return quickly (it holds signals).
        on_result: called with ``(k, result)`` for the k-th run fed (0-based) as its result
            comes in (a worker that died meanwhile: an infrastructure-error result), after the
            worker got its next run; not called after a signal. It may take long (a shrink).
        opts: the suite's options (report_dir: parent of the run folders; after_checks).
        jobs: worker processes (at least 1).
        run_fn: what a worker calls for each run, a module-level function (it is pickled by
            reference) with :func:`chaos.runner.suite.run_in_pool`'s signature and contract;
            None: run_in_pool.
        say: progress lines.

    Returns:
        ``(results, suite_dir)``: results in the order fed; the suite report in ``suite_dir``.

    Raises:
        RunInterrupted: SIGINT or SIGTERM (also one raised by ``on_result``); every run under
            way was healed and reported, every worker's stacks are down, the suite report is
            written.
    """
    return _Campaign([], opts, max(1, jobs), say, feed=feed, on_result=on_result, run_fn=run_fn).run()


# --- the parent -------------------------------------------------------------------------------

_EOF = object()


@dataclass
class _Worker:
    number: int
    proc: subprocess.Popen
    stacks: dict  # stack file -> variables of the stack its pool holds
    busy: int | None = None  # index of the run it has
    gone: bool = False  # its output ended


class _Campaign:
    def __init__(self, items: list[CampaignRun], opts: SuiteOptions, jobs: int,
                 say: Callable[[str], None], feed: Callable[[], CampaignRun | None] | None = None,
                 on_result: Callable[[int, RunResult], None] | None = None, run_fn: RunFn | None = None) -> None:
        self.items, self.opts, self.jobs, self.say = items, opts, jobs, say
        self.feed, self.on_result, self.run_fn = feed, on_result, run_fn
        self.fresh: list[int] = []  # results not yet shown to on_result
        self.fed_out = False  # feed said there are no more runs
        self.suite_id = new_run_id(opts.run_id_prefix + "suite")
        self.suite_dir = opts.report_dir / self.suite_id
        self.inbox: queue.Queue = queue.Queue()
        self.workers: list[_Worker] = []
        self.pending: list[int] = list(range(len(items)))
        self.boxes: dict[int, dict] = {}
        self.results: dict[int, RunResult] = {}
        self.numbered = 0

    def run(self) -> tuple[list[RunResult], Path]:
        stop: RunInterrupted | None = None
        with interrupts.handling():
            try:
                interrupts.set_stage("campaign")
                for _ in range(self.jobs):
                    self._spawn()
                self._loop()
            except KeyboardInterrupt as exc:
                stop = interrupts.as_interrupt(exc)
            finally:
                stop = self._drain(stop)
                results = [self.results[i] for i in sorted(self.results)]
                try:
                    with interrupts.deferred():
                        info = None if stop is None else InterruptInfo(
                            signal=stop.signal_name, exit_code=stop.exit_code, stage=stop.stage)
                        if results or stop is not None:
                            write_suite(self.suite_dir, self.suite_id, results, interrupted=info)
                except KeyboardInterrupt as exc:
                    stop = stop or interrupts.as_interrupt(exc)
        if stop is not None:
            stop.suite_dir = self.suite_dir
            stop.results = results
            raise stop
        return results, self.suite_dir

    # workers

    def _spawn(self) -> _Worker:
        with interrupts.deferred():
            self.numbered += 1
            proc = subprocess.Popen(
                [sys.executable, "-c", "from chaos.campaign import worker_main; worker_main()"],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, start_new_session=True,
                env=dict(os.environ, KVCHAOS_CAMPAIGN_PARENT=str(os.getpid())))
            w = _Worker(self.numbered, proc, {})
            self.workers.append(w)
            _send(proc.stdin, {"worker": w.number, "backend": self.opts.backend, "keep": self.opts.keep_stack,
                               "root": str(self.suite_dir / "stacks"), "opts": self.opts, "run_fn": self.run_fn})
            threading.Thread(target=self._read, args=(w,), daemon=True, name=f"worker-{w.number}").start()
        self.say(f"worker {w.number} started (pid {proc.pid})")
        return w

    def _read(self, w: _Worker) -> None:
        """Thread: every message of worker ``w`` into the inbox, then _EOF."""
        stream = w.proc.stdout
        try:
            while True:
                self.inbox.put((w, pickle.load(stream)))
        except (EOFError, OSError, pickle.UnpicklingError, AttributeError, ValueError):
            pass
        self.inbox.put((w, _EOF))

    def _live(self) -> list[_Worker]:
        return [w for w in self.workers if not w.gone]

    def _pick(self, w: _Worker) -> int | None:
        """The pending run worker ``w`` should take: one on the stack its pool holds (file and
        variables), else one on a stack file it holds, else the first."""
        if not self.pending:
            return None

        def key(i: int) -> tuple[Path, dict]:
            s = self.items[i].scenario
            return Path(s.stack).resolve(), s.stack_variables()

        for i in self.pending:
            f, v = key(i)
            if w.stacks.get(f) == v:
                return i
        for i in self.pending:
            if key(i)[0] in w.stacks:
                return i
        return self.pending[0]

    def _dispatch(self, w: _Worker) -> None:
        i = self._pick(w)
        if i is None and self.feed is not None and not self.fed_out:
            nxt = self.feed()
            self.fed_out = nxt is None
            if nxt is not None:
                self.items.append(nxt)
                self.pending.append(len(self.items) - 1)
                i = self.pending[-1]
        if i is None:
            with interrupts.deferred():
                w.proc.stdin.close()  # no more work: the worker brings its stacks down and exits
            return
        item = self.items[i]
        with interrupts.deferred():
            self.pending.remove(i)
            run_id, run_dir = prepare_run(item.scenario, self.opts)
            self.boxes[i] = {"scenario": item.scenario, "run_id": run_id, "run_dir": run_dir, "result": None}
            w.busy = i
            # The worker keeps one stack: the one of its last run (StackPool.keep_only).
            w.stacks = {Path(item.scenario.stack).resolve(): item.scenario.stack_variables()}
            try:
                _send(w.proc.stdin, {"index": i, "scenario": item.scenario, "run_id": run_id,
                                     "run_dir": str(run_dir), "timeout_s": item.timeout_s})
            except OSError:
                pass  # it died meanwhile: its _EOF comes, the run gets its infrastructure error

    def _loop(self) -> None:
        for w in list(self.workers):
            self._dispatch(w)
        while self._live():
            self._pump(None)

    def _pump(self, stopping: RunInterrupted | None) -> None:
        """Wait (at most half a second) for one message of a worker and act on it: record a
        result and give the worker its next run (unless ``stopping``), or reap a worker whose
        output ended (and start another while runs are pending). Signals are held while a
        message is handled, so none is lost between the queue and the results; then (unless
        ``stopping``) new results go to ``on_result``, with signals let through."""
        with interrupts.deferred():
            try:
                w, msg = self.inbox.get(timeout=0.5)
            except queue.Empty:
                return
            if msg is _EOF:
                self._gone(w, stopping)
                more = self.pending or (self.feed is not None and not self.fed_out)
                if stopping is None and more and not any(x.busy is None and not x.gone for x in self.workers):
                    self._dispatch(self._spawn())
            elif "index" in msg:
                self._result(w, msg)
                if stopping is None and not w.proc.stdin.closed:
                    if msg["result"].interrupted is None:
                        self._dispatch(w)
                    else:  # a signal sent to the worker alone: it stops; another takes its place
                        w.proc.stdin.close()
        while self.fresh and stopping is None and self.on_result is not None:
            i = self.fresh.pop(0)
            self.on_result(i, self.results[i])

    def _result(self, w: _Worker, msg: dict) -> None:
        i = msg["index"]
        self.results[i] = msg["result"]
        self.boxes[i]["result"] = msg["result"]
        self.fresh.append(i)
        w.busy = None

    def _gone(self, w: _Worker, stopping: RunInterrupted | None) -> None:
        """Worker ``w``'s output ended: reap it; a run it still had gets an infrastructure-error
        result (or ``interrupted`` while stopping), and what its journals hold is undone."""
        w.gone = True
        try:
            code = w.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            w.proc.kill()
            code = w.proc.wait()
        if w.busy is None and code in (0, 130, 143):
            return
        i, w.busy = w.busy, None
        how = f"killed by {signal.Signals(-code).name}" if code < 0 else f"exit code {code}"
        undone = _undo_journals_of(w.proc.pid)
        if i is not None and i not in self.results:
            box = self.boxes[i]
            with interrupts.deferred():
                if stopping is not None:
                    self.results[i] = interrupted_result(box["scenario"], box["run_id"], box["run_dir"], stopping)
                else:
                    self.results[i] = infra_error_result(
                        box["scenario"], box["run_id"], box["run_dir"],
                        f"campaign worker {w.number} (pid {w.proc.pid}) died during this run ({how})"
                        + (f"; undone from its journals: {'; '.join(undone)}" if undone else ""))
                    self.fresh.append(i)
            self.say(f"[{box['scenario'].name}] worker {w.number} (pid {w.proc.pid}) died ({how})")
        elif stopping is None:
            self.say(f"worker {w.number} (pid {w.proc.pid}) ended ({how})")

    def _drain(self, stop: RunInterrupted | None) -> RunInterrupted | None:
        """Forward a signal to the workers (if one came), close their input, and wait until
        every one has sent its last result and exited (at most DRAIN_S after a signal); kill
        the rest and undo their journals. Returns the signal that stopped the campaign."""
        deadline = None
        forwarded = False
        while True:
            try:
                with interrupts.stage("teardown"):
                    if stop is not None and not forwarded:
                        forwarded = True
                        deadline = time.monotonic() + DRAIN_S
                        self.say(f"{stop.describe()}: stopping {len(self._live())} worker(s)")
                        for w in self._live():
                            try:
                                os.kill(w.proc.pid, stop.signum)
                            except ProcessLookupError:
                                pass
                    for w in self._live():
                        if not w.proc.stdin.closed:
                            try:
                                w.proc.stdin.close()
                            except OSError:
                                pass
                    while self._live():
                        if deadline is not None and time.monotonic() > deadline:
                            for w in self._live():
                                self.say(f"worker {w.number} (pid {w.proc.pid}) still runs after "
                                         f"{DRAIN_S:.0f}s: killing it")
                                w.proc.kill()
                            deadline = None
                        self._pump(stop)
                return stop
            except KeyboardInterrupt as exc:
                stop = stop or interrupts.as_interrupt(exc)


def _send(stream: BinaryIO, msg: Any) -> None:
    pickle.dump(msg, stream, protocol=pickle.HIGHEST_PROTOCOL)
    stream.flush()


def _send_quietly(stream: BinaryIO, msg: Any) -> None:
    """A worker's message to its parent; a parent that is gone (the kernel's SIGTERM on its
    death brought us here) is not an error: the report is on disk and the stacks go down."""
    try:
        _send(stream, msg)
    except OSError:
        pass


def _undo_journals_of(pid: int) -> list[str]:
    """Undo (as ``kvchaos cleanup`` does) the journals process ``pid`` owned (a dead worker's
    faults and stacks); returns what was undone and what failed, one line each."""
    from chaos.cleanup import cleanup
    from chaos.journal import all_journals, owners

    mine = [j.stem for j in all_journals() if any(o.get("pid") == pid for o in owners(j))]
    if not mine:
        return []
    rep = cleanup(force=mine, only=mine)
    return rep.undone + [f"error: {e}" for e in rep.errors]


# --- a worker ---------------------------------------------------------------------------------

def _die_with_parent() -> None:
    """SIGTERM this process when the parent ends, however it ends (Linux ``PR_SET_PDEATHSIG``);
    if the parent is already gone, the same at once."""
    parent = int(os.environ.get("KVCHAOS_CAMPAIGN_PARENT", "0"))
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, int(signal.SIGTERM), 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    if parent and os.getppid() != parent:
        os.kill(os.getpid(), signal.SIGTERM)


def worker_main() -> None:
    """Entry point of a campaign worker (started by :class:`_Campaign`): reads pickled runs on
    stdin, runs each on its own StackPool (with the campaign's ``run_fn``, default run_in_pool),
    writes pickled results on stdout; at the end of its input it brings its stacks down and
    exits 0; on SIGINT/SIGTERM it reports the run under way as ``interrupted``, brings its
    stacks down and exits 128 + the signal. Progress lines go to
    stderr, prefixed ``[scenario]``."""
    out = os.fdopen(os.dup(1), "wb")  # the protocol; fd 1 becomes stderr so that nothing else
    os.dup2(2, 1)  # printed reaches the parent's pipe (the fds are not inherited by services)
    inp = os.fdopen(os.dup(0), "rb")
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    for sig in interrupts.SIGNALS:  # driven by the parent, whatever a shell set us to ignore
        signal.signal(sig, signal.SIG_DFL)
    stop: RunInterrupted | None = None
    with interrupts.handling():
        try:
            _die_with_parent()
            hello = pickle.load(inp)
        except KeyboardInterrupt as exc:  # before any stack: nothing to heal or stop
            sys.exit(interrupts.as_interrupt(exc).exit_code)
        except EOFError:
            sys.exit(0)
        number, opts = hello["worker"], hello["opts"]
        run_fn = hello.get("run_fn") or run_in_pool
        name = {"run": ""}

        def say(msg: str) -> None:
            if not msg.startswith("["):
                msg = f"[{name['run']}] {msg}" if name["run"] else f"worker {number}: {msg}"
            text = f"[{time.strftime('%H:%M:%S')}] {msg}\n"
            try:
                os.write(2, text.encode())
            except OSError:
                pass

        pool = StackPool(hello["backend"], Path(hello["root"]), keep=hello["keep"])
        box: dict | None = None
        try:
            while True:
                try:
                    task = pickle.load(inp)
                except EOFError:
                    break
                name["run"] = task["scenario"].name
                for gone in pool.keep_only(Path(task["scenario"].stack)):
                    say(f"stopping stack {gone.name}: this worker's next run is on another stack file")
                box = {"scenario": task["scenario"], "run_id": task["run_id"], "run_dir": Path(task["run_dir"]),
                       "result": None, "index": task["index"]}
                result = run_fn(task["scenario"], pool, opts, task["run_id"], Path(task["run_dir"]), say,
                                box, timeout_s=task["timeout_s"])
                with interrupts.deferred():
                    _send_quietly(out, {"index": task["index"], "result": result})
                    box = None
                name["run"] = ""
        except KeyboardInterrupt as exc:
            stop = interrupts.as_interrupt(exc)
            if box is not None:
                with interrupts.deferred():
                    _send_quietly(out, {"index": box["index"], "result": result_after_interrupt(box, stop)})
        finally:
            stop = close_pool(pool, say, stop)
    out.close()
    sys.exit(stop.exit_code if stop is not None else 0)
