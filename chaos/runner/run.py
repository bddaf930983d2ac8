"""Run one scenario against a running stack: phases, the nemesis, quiesce, oracle, checks.

    baseline (stack healthy, leak-source baselines read) ─> phase 1 ─> phase 2 ─> ... ─> heal all
        each phase: workload (chaos/workload)  ║  nemesis: apply at start, heal at end
    ─> quiesce (leak sources polled until back at baseline or deadline)
    ─> twin baseline (only when a request went past its deadline or SLO bound with no fault in
       place: the recompute twin timed on its prompt, chaos/runner/baseline.py)
    ─> oracle (recompute twin; tolerant mode: its logprobs, and the twin asked again = noise floor)
    ─> checks (pure functions of history + snapshots) ─> report

Every fault that was applied is healed on every exit path (return, exception, Ctrl-C,
SIGTERM, the scenario deadline): heal runs in ``finally``, one fault at a time, each even if an
earlier heal failed (Chaos Toolkit's rollbacks). Before a fault is applied it is written to the
journal (chaos/journal.py) so ``kvchaos cleanup`` can heal it if the runner is SIGKILLed.

A heal that raises (a killed service that did not come back healthy, its port taken by another
process; a toxic the proxy would not remove; links the restarted proxy could not create) leaves a
stack that is no longer the one the scenario describes: the run is an infrastructure error
(:class:`HealFailed`: verdict unknown, exit code 3, ``error`` naming the fault and the heal's
error), the rest of its phase is cut short and no later phase runs; every other fault is still
healed and the report written, with the failed fault's evidence where it can be read.

A SIGINT or SIGTERM at any stage (chaos/interrupts.py) skips what is left of the phases, quiesce,
oracle and checks, heals, and writes the report with verdict ``interrupted`` (the signal, the
stage, the phases that ran, what was healed) before RunInterrupted leaves with the result on it.
Heals and the report are written with signals held, so a signal never splits them.
"""

from __future__ import annotations

import asyncio
import json
import random
import threading
import time
import traceback
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from chaos.checks import liveness as liveness_check
from chaos.checks import slo as slo_check
from chaos.checks.registry import run_checks
from chaos.checks.requests import requests as paired_requests
from chaos.checks.result import CheckResult
from chaos.checks.snapshots import ServiceExit as SnapshotExit
from chaos.checks.snapshots import Snapshots
from chaos.faults import registry as fault_registry
from chaos.faults.base import Fault, FaultContext, FaultParams
from chaos import interrupts
from chaos.history import HistoryWriter
from chaos.interrupts import RunInterrupted
from chaos.journal import Journal
from chaos.oracle import TOP_K, OracleError, RecomputeOracle
from chaos.report.model import InterruptInfo, RunResult
from chaos.probes import TriggerWatch
from chaos.report.result import build_result
from chaos.report.writer import write_report
from chaos.runner.baseline import measure_twin
from chaos.runner.leaks import poll_until_quiet, read_baselines
from chaos.checks.config import EvidenceConfig
from chaos.scenario.model import Phase, Scenario
from chaos.stack.base import Stack
from chaos.stack.interpolate import interpolate
from chaos.stack.spec import LeakSource
from chaos.workload.client import CompletionClient
from chaos.workload.driver import run_conversations
from chaos.workload.generator import plan_phase

class HealFailed(RuntimeError):
    """A fault's heal raised: the stack is not the one the scenario describes any more, so the run
    is an infrastructure error, not a verdict on the system under test.

    Attributes:
        fault_id: the fault's id; kind: its kind.
        error: the heal's error, ``"Type: message"`` (a StackError names the service, the port
            and the process that holds it).
    """

    def __init__(self, fault_id: str, kind: str, error: str) -> None:
        self.fault_id, self.kind, self.error = fault_id, kind, error
        super().__init__(f"heal of fault {fault_id} ({kind}) failed: {error}")


@dataclass
class AppliedFault:
    """A fault the nemesis started applying (so it must be healed)."""

    fault: Fault
    phase: str
    healed: bool = False
    heal_ok: bool | None = None
    #: The heal's error (``"Type: message"``) when it raised.
    heal_error: str | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)
    #: The fault's trigger being watched while it is in place (None: it declares none).
    watch: TriggerWatch | None = None


class Nemesis:
    """Applies and heals a scenario's faults on the phase clock, recording both on the history.

    A fault's ``trigger`` is watched by the nemesis, the same way for every kind: baselines just
    before apply, samples while in place, the final reading just before heal; the result goes on
    the heal record next to the fault's own evidence (``value.trigger``). A fault that declares
    none (and not ``trigger: none``) gets its kind's default (``Fault.default_trigger``), recorded
    on its apply record (``value.default_trigger``) and judged from the history by the
    `evidence` check.
    """

    def __init__(self, ctx: FaultContext, history: HistoryWriter, journal: Journal, proxy_api: str | None) -> None:
        self.ctx = ctx
        self.history = history
        self.journal = journal
        self.proxy_api = proxy_api
        self.applied: list[AppliedFault] = []
        #: Phase name -> its start on the history clock (s since run start), as phases begin.
        self.phase_starts: dict[str, float] = {}

    def phase_started(self, phase: str) -> None:
        """Record that ``phase`` starts now (a ``phase`` op with ``value.event: start``: what a
        timing premise, ``ends_within`` or ``checks.leaks.back_within``, counts from)."""
        op = self.history.append("nemesis", "ok", "phase", phase=phase, value={"event": "start"})
        self.phase_starts[phase] = op.time

    def phase_ended(self, phase: Phase) -> None:
        """Record that ``phase`` ends now (its requests, fault timelines and duration are done):
        with an ``ends_within`` premise, a ``window`` op whose ``value`` is ``{"scope": "phase",
        "reached": bool, "within_s", "since_phase", "took_s"}`` (``took_s``: seconds from the
        start of ``since_phase`` to now; the evidence check makes a run that missed it
        inconclusive); then a ``phase`` op with ``value.event: end``."""
        within = phase.ends_within
        if within is not None:
            ref = within.phase or phase.name
            start = self.phase_starts.get(ref)
            took = None if start is None else self.history.now() - start
            self.history.append("nemesis", "ok", "window", phase=phase.name,
                                value={"scope": "phase", "reached": took is not None and took <= within.s,
                                       "within_s": within.s, "since_phase": ref, "took_s": took})
        self.history.append("nemesis", "ok", "phase", phase=phase.name, value={"event": "end"})

    def apply(self, fault: Fault, phase: str, beside: Sequence[FaultParams] = ()) -> None:
        """Apply ``fault`` now (blocking); records invoke, then ok or fail. ``beside``: the
        params of the phase's other faults (a kind's default trigger may depend on them:
        ``Fault.default_trigger_beside``)."""
        p = fault.params
        params = p.model_dump(mode="json")
        stack_env = {k: v for k, v in (getattr(self.ctx.stack, "env", None) or {}).items()
                     if k.endswith("_PORT") or k.startswith("KVCHAOS_")}
        self.journal.add("fault", fault.id, fault_kind=p.kind, params=params, proxy_api=self.proxy_api,
                         stack_env=stack_env)
        entry = AppliedFault(fault, phase, watch=self.watch(p.conditions))
        self.applied.append(entry)
        default = ({} if p.conditions or p.window_unproven
                   else {"default_trigger": type(fault).default_trigger_beside(p, beside).as_record(p.kind)})
        self.history.append("nemesis", "invoke", "apply", phase=phase, fault_id=fault.id,
                            value={"kind": p.kind, "params": params, **default})
        if entry.watch is not None:
            entry.watch.begin()
        try:
            done = fault.apply(self.ctx)
        except Exception as exc:  # recorded; heal still runs at the end
            self.history.append("nemesis", "fail", "apply", phase=phase, fault_id=fault.id,
                                value={"kind": p.kind, "error": f"{type(exc).__name__}: {exc}"})
            return
        if entry.watch is not None:
            entry.watch.start()
        self.history.append("nemesis", "ok", "apply", phase=phase, fault_id=fault.id,
                            value={"kind": p.kind, **_jsonable(done)})

    def heal(self, entry: AppliedFault) -> None:
        """Heal one applied fault (idempotent); records invoke, then ok (with evidence) or fail
        (with the error, and the evidence where it can still be read).

        Raises:
            HealFailed: the fault's heal raised (once; a second call is a no-op).
        """
        with entry.lock:
            if entry.healed:
                return
            entry.healed = True
        fault, phase = entry.fault, entry.phase
        kind = fault.params.kind
        self.history.append("nemesis", "invoke", "heal", phase=phase, fault_id=fault.id, value={"kind": kind})
        trigger = {"trigger": entry.watch.finish()} if entry.watch is not None else {}
        try:
            done = fault.heal(self.ctx)
        except Exception as exc:
            entry.heal_ok = False
            entry.heal_error = f"{type(exc).__name__}: {exc}"
            self.history.append("nemesis", "fail", "heal", phase=phase, fault_id=fault.id,
                                value={"kind": kind, "error": entry.heal_error,
                                       "evidence": _jsonable(self._evidence(fault)), **_jsonable(trigger)})
            raise HealFailed(fault.id, kind, entry.heal_error) from exc
        entry.heal_ok = True
        evidence = self._evidence(fault)
        self.journal.remove("fault", fault.id)
        self.history.append("nemesis", "ok", "heal", phase=phase, fault_id=fault.id,
                            value={"kind": kind, **_jsonable(done), "evidence": _jsonable(evidence),
                                   **_jsonable(trigger)})

    def _evidence(self, fault: Fault) -> dict[str, Any]:
        """``fault.evidence(ctx)``; ``{"bit": False, "error": ...}`` when that raises."""
        try:
            return fault.evidence(self.ctx)
        except Exception as exc:
            return {"bit": False, "error": f"{type(exc).__name__}: {exc}"}

    def watch(self, conditions: list) -> TriggerWatch | None:
        """A watch of ``conditions`` on the context's stack; None for no conditions."""
        if not conditions:
            return None
        return TriggerWatch(conditions, self.ctx.stack)

    def heal_all(self) -> list[str]:
        """Heal every applied fault not yet healed, newest first; returns the errors of the heals
        that failed (``HealFailed``'s text: the fault and the error). Never raises but for a
        signal held meanwhile, raised as RunInterrupted once all are healed."""
        errors = []
        with interrupts.deferred():
            for entry in reversed(self.applied):
                try:
                    self.heal(entry)
                except Exception as exc:  # keep healing the others
                    errors.append(str(exc))
        return errors

    def cancel_for(self, plan) -> Any:
        """The Cancel for a request about to start, from the first active fault that has a
        ``cancel_for(plan, ctx)`` method (the ``cancel`` fault); None when none wants it."""
        for entry in self.applied:
            pick = getattr(entry.fault, "cancel_for", None)
            if pick is not None and not entry.healed:
                cancel = pick(plan, self.ctx)
                if cancel is not None:
                    return cancel
        return None

    def pending(self, phase: str) -> list[AppliedFault]:
        return [e for e in self.applied if e.phase == phase and not e.healed]


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, (str, int, float, bool)) or obj is None:
        return obj
    dump = getattr(obj, "model_dump", None)
    if callable(dump):
        return dump(mode="json")
    return str(obj)


async def _run_phase(scenario: Scenario, phase: Phase, nemesis: Nemesis, client: CompletionClient | None,
                     deadline_s: float | None) -> None:
    """One phase: the workload and the phase's faults on one clock.

    With ``requests_start: after_faults`` (the default) the faults that start at 0 are applied
    first, in file order, and the requests start once they are in place; later faults keep their
    ``start`` on the phase clock, and while one with ``hold_requests`` is being applied no new
    request is sent (those in flight go on); a fault with ``after: requests`` counts its
    ``start`` from when the phase's requests are done. The phase's own ``trigger`` is watched from the phase start
    until its requests and fault timelines are done (before ``until: end`` faults are healed).
    """
    loop_t0 = time.monotonic()
    nemesis.phase_started(phase.name)
    faults = [fault_registry.build_fault(p) for p in phase.faults]

    def beside_of(fault: Fault) -> list[FaultParams]:
        return [q.params for q in faults if q is not fault]
    watch = nemesis.watch(phase.conditions)
    if watch is not None:
        await asyncio.to_thread(watch.begin)
        watch.start()

    requests_done = asyncio.Event()
    requests_done_at: list[float] = []
    # The request gate: clear while a `hold_requests` fault is being applied (a count, as two
    # may be due at once), so requests still come after the fault is in place however late the
    # apply lands on a loaded host.
    gate = asyncio.Event()
    gate.set()
    holding = [0]
    in_place_at: dict[int, float] = {}  # id(fault) -> when its apply returned (held faults)

    async def apply_holding(fault: Fault) -> None:
        holding[0] += 1
        gate.clear()
        try:
            await asyncio.to_thread(nemesis.apply, fault, phase.name, beside_of(fault))
        finally:
            in_place_at[id(fault)] = time.monotonic()
            holding[0] -= 1
            if holding[0] == 0:
                gate.set()

    async def fault_timeline(fault: Fault, applied: bool) -> None:
        p = fault.params
        t0 = loop_t0
        if p.after == "requests":
            await requests_done.wait()
            t0 = requests_done_at[0]
        heal_at = None if p.duration is None else t0 + p.start + p.duration
        if not applied:
            await asyncio.sleep(max(0.0, p.start - (time.monotonic() - t0)))
            if p.hold_requests:
                await apply_holding(fault)
            else:
                await asyncio.to_thread(nemesis.apply, fault, phase.name, beside_of(fault))
        if p.hold_requests and heal_at is not None:
            # Held: its `duration` counts from when it is in place, so the requests it held
            # meet it for that long however late the apply landed.
            heal_at = in_place_at.get(id(fault), time.monotonic()) + p.duration
        if heal_at is not None:
            await asyncio.sleep(max(0.0, heal_at - time.monotonic()))
            entry = next(e for e in nemesis.applied if e.fault is fault)
            await asyncio.to_thread(nemesis.heal, entry)

    n = scenario.phase_requests(phase)
    conversations = plan_phase(scenario.workload, scenario.seed, phase.name, n) if n else []
    first = ([f for f in faults if f.params.start <= 0 and f.params.after == "phase_start"]
             if phase.requests_start == "after_faults" else [])
    tasks: list[asyncio.Task] = []
    try:
        for f in first:  # in place before the first request is sent
            await asyncio.to_thread(nemesis.apply, f, phase.name, beside_of(f))
            in_place_at[id(f)] = time.monotonic()
        tasks = [asyncio.create_task(fault_timeline(f, f in first)) for f in faults]
        if conversations:
            assert client is not None  # load_and_validate: a stack without engine_url sends nothing
            await _unless_one_fails(run_conversations(client, conversations, phase=phase.name,
                                                      concurrency=scenario.workload.concurrency,
                                                      deadline_s=deadline_s, cancel_for=nemesis.cancel_for,
                                                      gate=gate),
                                    tasks)
        requests_done_at.append(time.monotonic())
        requests_done.set()
        if tasks:
            await asyncio.gather(*tasks)
        if phase.duration is not None:
            await asyncio.sleep(max(0.0, phase.duration - (time.monotonic() - loop_t0)))
    finally:
        for t in tasks:
            if not t.done():
                t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        nemesis.phase_ended(phase)
        if watch is not None:
            result = await asyncio.to_thread(watch.finish)
            nemesis.history.append("nemesis", "ok", "trigger", phase=phase.name,
                                   value={"scope": "phase", **result})
        elif phase.window_unproven:
            nemesis.history.append("nemesis", "ok", "trigger", phase=phase.name,
                                   value={"scope": "phase", "none": True, "reason": phase.reason})
    # `until: end` faults end with their phase.
    for entry in nemesis.pending(phase.name):
        await asyncio.to_thread(nemesis.heal, entry)


async def _unless_one_fails(main: Coroutine[Any, Any, Any], others: list[asyncio.Task]) -> None:
    """Run ``main`` to its end, unless one of ``others`` (the phase's fault timelines) raises
    first (a heal that failed, :class:`HealFailed`): then ``main`` is cancelled and that error
    raised, so no more requests go to a stack that is not the one the scenario describes.
    Cancelling this cancels ``main``."""
    task = asyncio.ensure_future(main)
    watched: set[asyncio.Future] = {task, *others}
    try:
        while not task.done():
            done, watched = await asyncio.wait(watched, return_when=asyncio.FIRST_COMPLETED)
            failed = [t for t in done if t is not task and not t.cancelled() and t.exception() is not None]
            if failed:
                raise failed[0].exception()  # type: ignore[misc]
        task.result()
    finally:
        if not task.done():
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


def _leak_sources(scenario: Scenario, stack: Stack) -> list[LeakSource]:
    """The leak sources to poll: the scenario's own (``checks.leaks.sources``, URLs expanded with
    the stack's variables) or else the stack's ``x-kvchaos.leak_sources``."""
    cfg = scenario.checks.leaks
    if cfg is None or cfg.sources is None:
        return list(stack.settings.leak_sources)
    return [LeakSource(name=s.name, url=interpolate(s.url, stack.env), format=s.format, baseline=s.baseline,
                       fields=s.fields) for s in cfg.sources]


#: What a run calls right after its checks have decided, on the stack the run used, with keyword
#: arguments ``run_id``, ``scenario`` (its name), ``stack``, ``run_dir``, ``history`` (the ops),
#: ``expected`` (request id -> the recompute twin's tokens), ``checks`` (CheckResults) and ``say``.
#: kvchaos hands chaos/diagnose/hook.py's ``diagnose_after_checks`` (the runner does not import the
#: diagnosis layer above it); what it returns is ignored, and a signal during it keeps the verdict.
AfterChecks = Callable[..., object]


def run_scenario(scenario: Scenario, stack: Stack, run_dir: Path, *, run_id: str,
                 timeout_s: float | None = None, progress=None,
                 after_checks: AfterChecks | None = None) -> RunResult:
    """Run ``scenario`` on a running ``stack`` and evaluate its checks.

    Args:
        scenario: validated scenario (chaos/scenario/loader.py).
        stack: a stack that is up (LocalStack or ComposeStack).
        run_dir: this run's report folder; ``history.jsonl`` is written there as the run goes.
        run_id: unique id (names the journal).
        timeout_s: overall deadline for the phases (None: no deadline); on expiry the run is
            an infrastructure error, faults are healed and the report still written.
        progress: optional callable(str) for status lines.
        after_checks: called once the checks have a verdict and the run was not interrupted
            (``AfterChecks``; None: nothing, e.g. no diagnosis of a shrink's candidates).

    Returns:
        The run's result (report written to ``run_dir``); never raises for check failures.

    Raises:
        RunInterrupted: SIGINT or SIGTERM (or Ctrl-C as KeyboardInterrupt) at any stage, after
            healing every fault and writing the report (verdict ``interrupted``, unless the signal
            came while the finished run's report was written); the result is on ``.result``.
    """
    before = interrupts.current_stage()
    with interrupts.handling():
        try:
            return _run_scenario(scenario, stack, run_dir, run_id=run_id, timeout_s=timeout_s, progress=progress,
                                 after_checks=after_checks)
        finally:  # the caller's stage again (a signal between two runs still names one)
            interrupts.set_stage(before)


def _run_scenario(scenario: Scenario, stack: Stack, run_dir: Path, *, run_id: str,
                  timeout_s: float | None, progress, after_checks: AfterChecks | None) -> RunResult:
    run_dir.mkdir(parents=True, exist_ok=True)
    say = progress or (lambda _msg: None)
    history = HistoryWriter(run_dir / "history.jsonl")
    journal = Journal(run_id)
    settings = stack.settings
    proxy_client = None
    if settings.proxy is not None:
        from chaos.proxy.client import ToxiproxyClient

        proxy_client = ToxiproxyClient(settings.proxy.api)
    ctx = FaultContext(proxy=proxy_client, stack=stack, history=history, rng=random.Random(scenario.seed),
                       scenario_dir=scenario.source.parent if scenario.source else Path.cwd(),
                       judges_service_exits=scenario.checks.liveness is not None)
    nemesis = Nemesis(ctx, history, journal, settings.proxy.api if settings.proxy else None)
    exits_before = len(stack.exits)
    snapshots = Snapshots(chunk_size=settings.chunk_size)
    error: str | None = None
    checks: list[CheckResult] = []
    oracle_info: dict[str, Any] = {}
    started = time.time()
    t0 = time.monotonic()
    liveness = scenario.checks.liveness
    deadline = liveness.request_deadline_s if liveness is not None else 120.0
    interrupted: RunInterrupted | None = None
    phases_run: list[str] = []
    equivalence = scenario.checks.recompute_equivalence
    tolerant = equivalence is not None and equivalence.mode == "tolerant"
    leak_sources = _leak_sources(scenario, stack)
    try:
        if scenario.checks.leaks is not None:
            interrupts.set_stage("leak baselines")
            snapshots.leak_baselines = read_baselines(leak_sources)

        async def phases() -> None:
            client = CompletionClient(settings.engine_url, history=history, cache_stats=True,
                                      logprobs=TOP_K if tolerant else None) if settings.engine_url else None
            try:
                for phase in scenario.phases:
                    say(f"phase {phase.name}")
                    interrupts.set_stage(f"phase {phase.name}")
                    phases_run.append(phase.name)
                    ctx.phase = phase.name
                    await _run_phase(scenario, phase, nemesis, client,
                                     liveness.deadline_for(phase.name) if liveness is not None else deadline)
            finally:
                if client is not None:
                    await client.aclose()

        async def bounded() -> None:
            if timeout_s is None:
                await phases()
            else:
                await asyncio.wait_for(phases(), timeout_s)

        try:
            interrupts.run_async(bounded())  # a signal cancels the phases' task
        except asyncio.TimeoutError:
            error = f"scenario deadline of {timeout_s:.0f}s passed"
        except HealFailed as exc:  # the stack is not the scenario's any more: no later phase runs
            error = str(exc)
        finally:
            interrupts.set_stage("heal")
            heal_errors = nemesis.heal_all()
            if heal_errors:
                error = (error + "; " if error else "") + "; ".join(heal_errors)
    except KeyboardInterrupt as exc:
        interrupted = interrupts.as_interrupt(exc)
    except Exception as exc:
        error = f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"
    finally:
        try:
            with interrupts.deferred():
                nemesis.heal_all()
                journal.close()
                if proxy_client is not None:
                    proxy_client.close()
        except KeyboardInterrupt as exc:
            interrupted = interrupted or interrupts.as_interrupt(exc)

    try:
        if error is None and interrupted is None:
            oracle_info = _evaluate(scenario, stack, settings, history, snapshots, exits_before, started,
                                    leak_sources, tolerant, say)
            checks = _checks(scenario, history, snapshots, say)
    except KeyboardInterrupt as exc:
        interrupted = interrupts.as_interrupt(exc)
        checks = []  # checks cut short are no verdict
    late: RunInterrupted | None = None
    if checks and interrupted is None and after_checks is not None:
        try:
            interrupts.set_stage("diagnosis")
            after_checks(run_id=run_id, scenario=scenario.name, stack=stack, run_dir=run_dir,
                         history=history.ops, expected=snapshots.expected, checks=checks, say=say)
        except KeyboardInterrupt as exc:  # the checks have decided: keep their verdict
            late = interrupts.as_interrupt(exc)
    try:
        with interrupts.deferred():
            interrupts.set_stage("report")
            info = None
            if interrupted is not None:
                say(f"interrupted by {interrupted.describe()}: faults healed, writing the report")
                info = InterruptInfo(signal=interrupted.signal_name, exit_code=interrupted.exit_code,
                                     stage=interrupted.stage, phases_run=phases_run,
                                     healed=[e.fault.id for e in nemesis.applied if e.heal_ok],
                                     not_healed=[e.fault.id for e in nemesis.applied if not e.heal_ok])
            result = _write(scenario, stack, run_dir, run_id, history, checks, deadline, started, t0,
                            snapshots, oracle_info, error, info, say)
    except KeyboardInterrupt as exc:  # held while the report was written; it is complete
        late = late or interrupts.as_interrupt(exc)
    stop = interrupted or late
    if stop is not None:
        stop.result = result
        raise stop
    return result


def _evaluate(scenario: Scenario, stack: Stack, settings, history: HistoryWriter, snapshots: Snapshots,
              exits_before: int, started: float, leak_sources: list[LeakSource], tolerant: bool,
              say) -> dict[str, Any]:
    """Quiesce (leak sources), service exits and the recompute oracle into ``snapshots``;
    returns what the oracle said of itself (oracle.json; {} without the check)."""
    say("quiesce")
    interrupts.set_stage("quiesce")
    leaks_cfg = scenario.checks.leaks
    if leaks_cfg is not None:
        samples, errs, waited = poll_until_quiet(leak_sources, leaks_cfg.quiesce_s, leaks_cfg.poll_interval_s,
                                                 history.now, baselines=snapshots.leak_baselines)
        snapshots.leak_sources = [s.name for s in leak_sources]
        snapshots.leak_samples, snapshots.leak_errors, snapshots.quiesce_waited_s = samples, errs, waited
    for e in stack.exits[exits_before:] + [x for x in stack.unexpected_exits() if x not in stack.exits[:exits_before]]:
        snap = SnapshotExit(service=e.service, time=max(0.0, e.time - started), returncode=e.returncode,
                            killed_by_fault=e.expected)
        if snap not in snapshots.service_exits:
            snapshots.service_exits.append(snap)
    _twin_baseline(scenario, settings, history, snapshots, say)
    if scenario.checks.recompute_equivalence is None:
        return {}
    say("recompute oracle")
    interrupts.set_stage("recompute oracle")
    try:
        oracle = RecomputeOracle(settings.recompute_url)
        if tolerant:
            snapshots.expected, snapshots.expected_top_logprobs = oracle.expected_with_logprobs(history.ops)
        else:
            snapshots.expected = oracle.expected_for(history.ops)
        info = {"fingerprint": oracle.fingerprint, "stored": oracle.hits, "asked": oracle.misses}
        if tolerant:
            say("noise floor (recompute twin asked again)")
            try:
                snapshots.recompute_replay, snapshots.recompute_replay_top_logprobs = \
                    oracle.replay(history.ops, concurrency=1)
                info["replayed"] = len(snapshots.recompute_replay)
            except OracleError as exc:
                snapshots.recompute_replay_error = str(exc)
        oracle.close()
    except OracleError as exc:
        info = {"error": str(exc)}
    return info


def _twin_baseline(scenario: Scenario, settings, history: HistoryWriter, snapshots: Snapshots, say) -> None:
    """Time the recompute twin on the prompts of requests that went past their deadline or SLO
    bound, a fault in place or not (chaos/runner/baseline.py), into ``snapshots.twin_baseline``;
    nothing when no request did."""
    ops = history.ops
    slow = {r.request_id: r for r in (liveness_check.slow_requests(ops, scenario.checks.liveness)
                                      if scenario.checks.liveness is not None else [])}
    for r in slo_check.slow_requests(ops, scenario.checks.slo):
        slow.setdefault(r.request_id, r)
    if not slow:
        return
    say(f"twin baseline ({len(slow)} slow request(s))")
    interrupts.set_stage("twin baseline")
    snapshots.twin_baseline = measure_twin(settings.recompute_url, list(slow.values()), paired_requests(ops),
                                           concurrency=scenario.workload.concurrency,
                                           run_async=interrupts.run_async)


def _checks(scenario: Scenario, history: HistoryWriter, snapshots: Snapshots, say) -> list[CheckResult]:
    say("checks")
    interrupts.set_stage("checks")
    configs = {name: getattr(scenario.checks, name) for name in scenario.checks.enabled()}
    if "evidence" not in configs and any(p.faults or p.window_unproven for p in scenario.phases):
        # Every fault has a window to prove (its trigger, or its kind's default): never a pass
        # that did not look (`kvchaos validate` warns that the check is added).
        configs["evidence"] = EvidenceConfig()
    return run_checks(history.ops, snapshots, configs)


def _write(scenario: Scenario, stack: Stack, run_dir: Path, run_id: str, history: HistoryWriter,
           checks: list[CheckResult], deadline: float, started: float, t0: float, snapshots: Snapshots,
           oracle_info: dict, error: str | None, info: InterruptInfo | None, say) -> RunResult:
    """Build the result and write the report (result.json, history, junit, html, logs)."""
    history.close()
    durations = {"total_s": time.monotonic() - t0}
    try:
        proxy = stack.proxy_info()
    except Exception as exc:  # noqa: BLE001 - never lose the report for a label
        proxy = {"impl": "unknown", "error": str(exc)[:200]}
    result = build_result(
        run_id=run_id, scenario=scenario.name, history=history.ops, checks=checks, seed=scenario.seed,
        description=scenario.description, scenario_path=str(scenario.source) if scenario.source else None,
        stack=str(stack.spec.path), started_at=time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(started)),
        deadline_s=deadline, xfail=scenario.expected_failure, durations=durations,
        service_exits=snapshots.service_exits, engine_bugs=scenario.engine.bugs, error=error,
        chunk_size=stack.settings.chunk_size or 256, interrupted=info, proxy=proxy)
    try:
        stack.collect_logs(run_dir / "logs")
    except OSError as exc:  # a missing log must not lose the report
        say(f"could not collect logs: {exc}")
    write_report(run_dir, result, history.ops)
    (run_dir / "snapshots.json").write_text(snapshots.model_dump_json(indent=2))
    if oracle_info:
        (run_dir / "oracle.json").write_text(json.dumps(oracle_info, indent=2))
    return result
