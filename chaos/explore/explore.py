"""The exploration loop: generated scenarios run one after another on one stack (or on N
campaign workers' stacks, ``--jobs N``), each failure diagnosed, shrunk and deduplicated by
signature.

    for index 0, 1, 2 ... until --max-runs or --budget (checked before each run and each shrink):
        chaos.explore.generate ──> scenarios/explore-<seed>-<index>.yaml ──> check_scenario
            (invalid: a generator bug, counted in ``generator_invalid``, never run)
        one StackPool (the stack starts once; a run that disrupted it or left something held
        gets it restarted, as in `kvchaos zoo`) ──> run_measured (diagnosis after the checks,
        chaos/diagnose/hook.py; LMCache's counters before and after) ──> runs/<run-id>/
        --jobs N: chaos/campaign.py run_stream: N workers, each its own StackPool, fed the next
        generated scenario when idle; every result comes back here, in the order they end
        failed ──> pre-signature (failed checks, diagnosis class, fault kinds as generated)
                   seen before: counted under the signature it got then, no shrink
                   new: `kvchaos shrink` (run_shrink, this process's pool, ``shrink_budget_s``;
                        with --jobs the workers go on meanwhile) ──>
                        signature (fault kinds of the shrunk file) ──> findings/<slug>.yaml
                        (one per signature: the first; it validates and runs alone)
        inconclusive ──> counted by the trigger it missed
    ──> summary.json + index.html (reports/explore/<explore-id>/)

SIGINT/SIGTERM: every run under way heals its faults and writes its report (chaos/runner/run.py),
the stacks go down, summary.json and index.html are still written, and RunInterrupted leaves
(exit 130 / 143).
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from chaos import interrupts
from chaos.checks.leaks import leaked_fields
from chaos.explore.generate import StackOffer, generate, write_scenario
from chaos.explore.guidance import CounterGuide, branch_arcs, counter_totals, grown
from chaos.explore.signature import (KnownFinding, Signature, diagnosis_class, fault_targets, match_known,
                                    run_log_window, signature_of)
from chaos.stack.base import StackError, new_run_id

__all__ = ["ExploreOptions", "ExploreSummary", "run_explore", "classify", "missed_triggers", "same_failure",
           "undecided_checks", "write_html"]


@dataclass
class ExploreOptions:
    """How to explore.

    Attributes:
        seed: the generator's seed.
        budget_s: wall seconds; no run or shrink starts after it (one under way finishes).
        max_runs: stop after this many runs (None: the budget alone).
        bugs: planted reference-engine bugs (chaos/engine/bugs.py) in every run.
        out: parent folder of the exploration's folder (``reports/explore``).
        backend: "local" or "compose".
        timeout_s: each run's deadline for its phases.
        shrink_budget_s: search seconds of each new finding's shrink (0: no shrink).
        shrink_reruns: final verification runs of a shrunk file (all must fail).
        diagnose: failing requests to diagnose per run (0: off).
        diagnose_budget_s: seconds of diagnosis per run.
        known: shipped findings (xfail scenarios) a signature may match.
        stop_on_finding: stop once a run gave a new signature that is not known (to measure the
            runs and time to a first finding); with planted bugs, one whose control run on the
            clean engine fails none of its checks, so that the finding is the bug's.
        guide: pick each run among the next ``guide_width`` generated scenarios by the record of
            their fault-kind set at reaching new LMCache counter combinations and, with ``jobs``
            1 on the local backend and a stack that passes ``KVCHAOS_ENGINE_COVERAGE`` to its
            engine (the reference stack), engine branches not run before
            (chaos/explore/guidance.py); False: the generated order.
        jobs: runs at once, each on a stack of its own (campaign workers); 1: one after
            another on this process's stack.
    """

    seed: int = 0
    budget_s: float = 7200.0
    max_runs: int | None = None
    bugs: list[str] = field(default_factory=list)
    out: Path = Path("reports/explore")
    backend: str = "local"
    timeout_s: float = 600.0
    shrink_budget_s: float = 300.0
    shrink_reruns: int = 2
    diagnose: int = 3
    diagnose_budget_s: float = 60.0
    known: list[KnownFinding] = field(default_factory=list)
    guide: bool = False
    guide_width: int = 4
    stop_on_finding: bool = False
    jobs: int = 1


@dataclass
class ExploreSummary:
    """What an exploration saw (written as summary.json; see :meth:`as_dict`)."""

    explore_id: str
    folder: Path
    stack: str
    seed: int
    bugs: list[str]
    budget_s: float
    max_runs: int | None
    started_at: str
    elapsed_s: float = 0.0
    stopped_by: str = ""
    runs: list[dict[str, Any]] = field(default_factory=list)
    signatures: dict[str, dict[str, Any]] = field(default_factory=dict)
    generator_invalid: list[dict[str, Any]] = field(default_factory=list)
    inconclusive_by_trigger: Counter = field(default_factory=Counter)
    guide: CounterGuide = field(default_factory=CounterGuide)
    guided: bool = False
    jobs: int = 1

    def counts(self) -> dict[str, int]:
        """Runs per outcome: passed, failed, inconclusive, error, interrupted."""
        c = Counter(r["outcome"] for r in self.runs)
        return {k: c.get(k, 0) for k in ("passed", "failed", "inconclusive", "error", "interrupted")}

    def window_reached_fraction(self) -> float | None:
        """Runs whose every trigger (declared or default) was reached, over the runs whose
        ``evidence`` check gave a verdict; None before any."""
        judged = [r for r in self.runs if r.get("window_reached") is not None]
        if not judged:
            return None
        return round(sum(1 for r in judged if r["window_reached"]) / len(judged), 3)

    def as_dict(self) -> dict[str, Any]:
        """summary.json's content."""
        return {
            "explore_id": self.explore_id, "stack": self.stack, "seed": self.seed, "bugs": self.bugs,
            "budget_s": self.budget_s, "max_runs": self.max_runs, "started_at": self.started_at,
            "elapsed_s": round(self.elapsed_s, 1), "stopped_by": self.stopped_by,
            "run_count": len(self.runs), **self.counts(),
            "window_reached_fraction": self.window_reached_fraction(),
            "guided": self.guided, "jobs": self.jobs,
            "lmcache_counter_combinations": len(self.guide.seen),
            "engine_branches": len(self.guide.branches) if self.guide.branches else None,
            "generator_invalid": self.generator_invalid,
            "inconclusive_by_trigger": dict(self.inconclusive_by_trigger.most_common()),
            "signatures": sorted(self.signatures.values(), key=lambda s: s["first_run_index"]),
            "runs": sorted(self.runs, key=lambda r: r["index"]),
        }

    def write(self) -> Path:
        """Write summary.json and index.html into the folder; returns summary.json's path."""
        self.folder.mkdir(parents=True, exist_ok=True)
        path = self.folder / "summary.json"
        path.write_text(json.dumps(self.as_dict(), indent=2) + "\n")
        write_html(self)
        return path


def classify(result: Any) -> str:
    """A run's outcome for the summary: passed, failed, inconclusive, error, interrupted."""
    if result.interrupted is not None or result.verdict == "interrupted":
        return "interrupted"
    if result.error:
        return "error"
    if result.verdict == "failed":
        return "failed"
    if result.verdict == "unknown":
        return "inconclusive"
    return "passed"


def missed_triggers(result: Any) -> list[str]:
    """What an inconclusive run did not reach, one key per missed trigger, e.g.
    ``latency: default trigger`` or ``phase hit: vllm:external_prefix_cache_hits_total``."""
    ev = next((c for c in result.checks if c.name == "evidence"), None)
    if ev is None:
        return []
    out = []
    for row in ev.details.get("faults", []):
        if row.get("problem"):
            what = "did not act" if not row.get("acted") else (
                "default trigger" if row.get("default_trigger") is not None else "trigger")
            out.append(f"{row.get('kind')}: {what}")
    for row in ev.details.get("phases", []):
        if row.get("problem"):
            t = row.get("trigger") or {}
            conds = t.get("conditions") or [t]
            names = sorted({str(c.get("metric") or c.get("log") or c.get("json") or "?") for c in conds
                            if isinstance(c, dict)})
            out.append(f"phase {row.get('phase')}: {', '.join(names) or row.get('problem', '')[:60]}")
    return out


def undecided_checks(result: Any) -> list[str]:
    """The checks other than ``evidence`` that gave ``unknown`` (e.g. hit_quality with too few
    samples), one key each: ``check hit_quality: undecided``. They make a run inconclusive
    although it reached every trigger."""
    return [f"check {c.name}: undecided" for c in result.checks if c.verdict == "unknown" and c.name != "evidence"]


def _window_reached(result: Any) -> bool | None:
    ev = next((c for c in result.checks if c.name == "evidence"), None)
    if ev is None or ev.verdict not in ("passed", "unknown"):
        return None
    return ev.verdict == "passed"


def _diagnosis(run_dir: Path) -> str:
    from chaos.diagnose.diagnose import load_diagnosis

    diag = load_diagnosis(run_dir)
    if diag is None or diag.error:
        return ""
    return diagnosis_class(diag.verdicts().values())


def run_explore(offer: StackOffer, opts: ExploreOptions,
                say: Callable[[str], None] = lambda _m: None) -> ExploreSummary:
    """Explore the stack ``offer`` describes until ``opts.max_runs`` or ``opts.budget_s``.

    With ``opts.jobs`` > 1 the generated runs go to that many campaign workers, each with a
    stack of its own (chaos/campaign.py :func:`run_stream`); every result is taken in this
    process as it comes, and a new finding's shrink and its control run on one more stack
    here, while the workers go on. The same seed generates the same scenarios; which of them
    run before the budget ends, and with ``guide`` which is picked, depend on the order the
    results come in.

    Returns:
        The summary (also written: ``<folder>/summary.json`` and ``index.html``).

    Raises:
        RunInterrupted: SIGINT or SIGTERM; the runs under way were healed and reported, the
            stacks are down and the summary is written (``stopped_by`` names the signal);
            ``.results`` holds ``[summary]``.
    """
    from chaos.diagnose.hook import ENV_BUDGET, ENV_LIMIT, diagnose_after_checks
    from chaos.runner.stacks import StackPool
    from chaos.runner.suite import SuiteOptions

    t0 = time.monotonic()
    explore_id = new_run_id(f"explore-{opts.seed}")
    folder = opts.out / explore_id
    summary = ExploreSummary(explore_id=explore_id, folder=folder, stack=str(offer.path), seed=opts.seed,
                             bugs=list(opts.bugs), budget_s=opts.budget_s, max_runs=opts.max_runs,
                             started_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), guided=opts.guide,
                             jobs=opts.jobs)
    measure_env = _engine_coverage_env(offer, opts, folder)
    saved_env = {k: os.environ.get(k) for k in (ENV_LIMIT, ENV_BUDGET, *measure_env)}
    os.environ[ENV_LIMIT] = str(opts.diagnose)  # read by the diagnosis after each run's checks,
    os.environ[ENV_BUDGET] = str(opts.diagnose_budget_s)  # here and in the campaign's workers
    os.environ.update(measure_env)  # the stacks started from here on measure their engine
    pool = StackPool(opts.backend, folder / "stacks")  # the serial runs; the findings' shrinks and controls
    explorer = _Explorer(offer, opts, summary, pool, t0, say)
    sopts = SuiteOptions(backend=opts.backend, report_dir=explorer.runs_dir, timeout_s=opts.timeout_s,
                         after_checks=diagnose_after_checks)
    stop: interrupts.RunInterrupted | None = None
    with interrupts.handling():
        try:
            if opts.jobs > 1:
                _explore_parallel(explorer, sopts, opts.jobs, say)
            else:
                _explore_serial(explorer, sopts, say)
        except KeyboardInterrupt as exc:
            stop = interrupts.as_interrupt(exc)
            for result in stop.results or []:  # the parallel runs' results not taken yet
                explorer.take_late(result)
            summary.stopped_by = f"interrupted ({stop.describe()})"
        finally:
            try:
                with interrupts.stage("teardown"):
                    say("stopping stacks")
                    pool.close()
            except KeyboardInterrupt as exc:
                stop = stop or interrupts.as_interrupt(exc)
            for k, v in saved_env.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
            summary.elapsed_s = time.monotonic() - t0
            with interrupts.deferred():
                summary.write()
    if stop is not None:
        stop.results = [summary]
        raise stop
    return summary


def _engine_coverage_env(offer: StackOffer, opts: ExploreOptions, folder: Path) -> dict[str, str]:
    """The environment that makes the exploration's stacks measure their engine's branches
    (``{KVCHAOS_ENGINE_COVERAGE: <folder>/engine-coverage/coveragerc}``) when the guide can use
    them: ``--guide``, one run at a time (one context file names the run under way), the local
    backend (the engine reads the file on this host) and a stack that passes the variable on;
    else {}."""
    from chaos.engine.measurement import COVERAGE_ENV

    if not (opts.guide and opts.jobs == 1 and opts.backend == "local" and offer.has(f"var:{COVERAGE_ENV}")):
        return {}
    from chaos.coverage import EngineCoverage

    measure = EngineCoverage(folder / "engine-coverage", settle_s=0)
    return dict(measure.variables)


@dataclass
class _Planned:
    """A generated scenario that validated, before it runs."""

    index: int
    file: Path
    data: dict
    scenario: Any


class _Explorer:
    """One exploration's state, shared by the serial loop and the parallel stream: the
    generator's queue, the run index, the signatures seen (``pre_seen``), the summary."""

    def __init__(self, offer: StackOffer, opts: ExploreOptions, summary: ExploreSummary, pool: Any, t0: float,
                 say: Callable[[str], None]) -> None:
        self.offer, self.opts, self.summary, self.pool, self.t0, self.say = offer, opts, summary, pool, t0, say
        self.queue: list[tuple[int, dict]] = []  # generated, not yet run: (stream index, scenario dict)
        self.stream = 0
        self.index = 0
        folder = summary.folder
        self.gen_dir, self.runs_dir, self.findings_dir = folder / "scenarios", folder / "runs", folder / "findings"
        self.pre_seen: dict[tuple, str] = {}  # (checks, diagnosis, generated fault kinds) -> signature text
        self.planned: dict[str, _Planned] = {}  # scenario name -> its plan (names are unique)
        self.taken: set[str] = set()  # run ids recorded

    def left(self) -> float:
        """Seconds of the budget left."""
        return self.opts.budget_s - (time.monotonic() - self.t0)

    def next_run(self) -> _Planned | None:
        """The next generated scenario that validates (one that does not is a generator bug,
        recorded and skipped), or None once the exploration must stop: a new finding with
        ``stop_on_finding``, ``max_runs`` runs generated, or the budget spent (``stopped_by``
        says which)."""
        from chaos.scenario.loader import check_scenario

        opts, summary = self.opts, self.summary
        while True:
            if opts.stop_on_finding and any(not g["known"] and (not opts.bugs or g["attributed_to_bug"])
                                            for g in summary.signatures.values()):
                summary.stopped_by = "first new finding"
                return None
            if opts.max_runs is not None and self.index >= opts.max_runs:
                summary.stopped_by = f"max-runs {opts.max_runs}"
                return None
            if self.left() <= 0:
                summary.stopped_by = f"budget {opts.budget_s:g}s"
                return None
            interrupts.set_stage(f"explore run {self.index}")
            while len(self.queue) < (opts.guide_width if opts.guide else 1):
                self.queue.append((self.stream, generate(self.offer, opts.seed, self.stream)))
                self.stream += 1
            pick = summary.guide.pick([d for _i, d in self.queue], _kinds) if opts.guide else 0
            _stream_index, data = self.queue.pop(pick)
            if opts.bugs:
                data.setdefault("engine", {})["bugs"] = list(opts.bugs)
            path = write_scenario(data, self.gen_dir)
            check = check_scenario(path, require_commands=opts.backend == "local")
            index = self.index
            self.index += 1
            if not check.ok:
                summary.generator_invalid.append({"index": index, "file": str(path), "error": str(check.error())})
                self.say(f"generator bug: {path} does not validate: {check.error()}")
                continue
            plan = _Planned(index, path, data, check.scenario)
            self.planned[plan.scenario.name] = plan
            self.say(f"[{index}] {plan.scenario.name}: {data['description']}")
            return plan

    def take(self, result: Any) -> None:
        """Record a run's result (its folder's ``explore-run.json`` gives its seconds and the
        LMCache counters it grew); a failed run's finding is diagnosed, shrunk and signed
        (:func:`_finding`) on this process's pool. The summary is written."""
        plan = self.planned[result.scenario]
        run_dir = self.runs_dir / result.run_id
        try:
            measured = json.loads((run_dir / MEASURED_FILE).read_text())
        except (OSError, ValueError):
            measured = {}
        summary = self.summary
        self.taken.add(result.run_id)
        _record(summary, plan.index, plan.file, run_dir, result, float(measured.get("seconds") or 0.0),
                time.monotonic() - self.t0)
        combination = measured.get("lmcache_counters_grown")
        row = summary.runs[-1]
        row["lmcache_counters_grown"] = combination
        branches = _engine_branches(result.run_id)
        row["engine_branches_new"] = None if branches is None else len(branches - summary.guide.branches)
        if branches is not None and not branches and not summary.guide.branches and result.checks:
            self.say(f"[{plan.index}] the engine recorded no branch of its own under this run (does it import "
                     "chaos/ from another checkout than this one?): only LMCache's counters guide")
        row["new_combination"] = summary.guide.record(_kinds(plan.data), None if combination is None
                                                      else frozenset(combination), branches)
        self.say(f"[{plan.index}] {row['outcome']}"
                 + (f": {', '.join(row['failed_checks'])}" if row["failed_checks"] else ""))
        if row["outcome"] == "failed":
            _finding(summary, self.opts, plan.index, run_dir, result, plan.scenario, self.pre_seen,
                     self.findings_dir, self.pool, self.t0, self.left, self.say)
        summary.write()

    def take_late(self, result: Any) -> None:
        """Record, without a finding's work, a result a signal left untaken (a parallel run
        that was under way: ``interrupted``)."""
        plan = self.planned.get(result.scenario)
        run_dir = self.runs_dir / result.run_id
        if plan is None or not run_dir.is_dir() or result.run_id in self.taken:  # not a generated run's (a shrink's)
            return
        self.taken.add(result.run_id)
        _record(self.summary, plan.index, plan.file, run_dir, result, 0.0, time.monotonic() - self.t0)


def _engine_branches(run_id: str) -> frozenset[str] | None:
    """The engine branches run ``run_id`` ran (its coverage context), when this exploration
    measures them (:func:`_engine_coverage_env`); None otherwise or when nothing was recorded."""
    from chaos.coverage import EngineCoverage

    measure = EngineCoverage.from_environment()
    return None if measure is None else branch_arcs(measure.dir, run_id)


#: A run's measures beside its report (``runs/<run-id>/explore-run.json``): ``seconds`` (the
#: stack's preparation and the run) and ``lmcache_counters_grown`` (None: LMCache's /metrics
#: could not be read).
MEASURED_FILE = "explore-run.json"


def run_measured(scenario: Any, pool: Any, opts: Any, run_id: str, run_dir: Path, say: Callable[[str], None],
                 box: dict, timeout_s: float | None = None) -> Any:
    """One generated run on ``pool`` (chaos/runner/suite.py ``run_in_pool``'s signature and
    contract, so that a campaign worker runs it): the stack is started, reset, or restarted
    where a run left it holding something (chaos/runner/leaks.py ``restart_dirty``); LMCache's
    counter totals are read before and after (chaos/explore/guidance.py); the run's report and
    :data:`MEASURED_FILE` are written in ``run_dir``.

    Returns:
        The run's RunResult (an infrastructure-error one when the stack could not be prepared).

    Raises:
        RunInterrupted: SIGINT or SIGTERM meanwhile (the report is written).
    """
    from chaos.runner.leaks import restart_dirty
    from chaos.runner.run import run_scenario
    from chaos.runner.suite import infra_error_result
    from chaos.yamlsource import ConfigError

    from chaos.coverage import EngineCoverage

    start = time.monotonic()
    combination = None
    measure = EngineCoverage.from_environment()  # the engine's branches, under the run's id
    try:
        stack = pool.acquire(Path(scenario.stack), scenario.stack_variables(), say=say)
        restart_dirty(stack, say)
    except (StackError, ConfigError) as exc:
        box["result"] = infra_error_result(scenario, run_id, run_dir, f"stack: {exc}")
    else:
        metrics = (stack.spec.settings.lmcache_http or "").rstrip("/")
        before = counter_totals(metrics + "/metrics") if metrics else None
        if measure is not None:
            measure.switch(run_id)
        box["result"] = run_scenario(scenario, stack, run_dir, run_id=run_id,
                                     timeout_s=opts.timeout_s if timeout_s is None else timeout_s,
                                     progress=lambda m, n=scenario.name: say(f"[{n}] {m}"),
                                     after_checks=opts.after_checks)
        if measure is not None:
            measure.switch("idle")  # waits for the engine's next save
        combination = grown(before, counter_totals(metrics + "/metrics") if metrics else None)
    result = box["result"]
    with interrupts.deferred():
        pool.release(Path(scenario.stack), result)
        (run_dir / "result.json").write_text(result.model_dump_json(indent=2))
        (run_dir / MEASURED_FILE).write_text(json.dumps({
            "seconds": round(time.monotonic() - start, 1),
            "lmcache_counters_grown": None if combination is None else sorted(combination)}) + "\n")
    return result


def _explore_serial(explorer: _Explorer, sopts: Any, say: Callable[[str], None]) -> None:
    """Generated runs one after another on the explorer's pool, until next_run says stop."""
    from chaos.runner.suite import prepare_run, result_after_interrupt

    while (plan := explorer.next_run()) is not None:
        run_id, run_dir = prepare_run(plan.scenario, sopts)
        box = {"scenario": plan.scenario, "run_id": run_id, "run_dir": run_dir, "result": None}
        try:
            result = run_measured(plan.scenario, explorer.pool, sopts, run_id, run_dir, say, box)
        except KeyboardInterrupt as exc:
            stop = interrupts.as_interrupt(exc)
            stop.results = [result_after_interrupt(box, stop)]
            raise stop from None
        explorer.take(result)


def _explore_parallel(explorer: _Explorer, sopts: Any, jobs: int, say: Callable[[str], None]) -> None:
    """Generated runs on ``jobs`` campaign workers (each its own stack), every result taken as
    it comes (a dead worker's run too: its infrastructure error); a signal's RunInterrupted
    carries every result, those not taken yet included (run_explore records them)."""
    from chaos.campaign import CampaignRun, run_stream

    def feed() -> CampaignRun | None:
        plan = explorer.next_run()
        return None if plan is None else CampaignRun(plan.scenario)

    run_stream(feed, lambda _k, result: explorer.take(result), sopts, jobs, run_fn=run_measured, say=say)


def _kinds(data: dict) -> list[str]:
    """The fault kinds of a generated scenario dict."""
    return sorted({f["kind"] for ph in data["phases"] for f in ph.get("faults", [])})


def _record(summary: ExploreSummary, index: int, path: Path, run_dir: Path, result: Any, seconds: float,
            elapsed: float) -> None:
    outcome = classify(result)
    row = {"index": index, "scenario_file": str(path), "run_dir": str(run_dir), "run_id": result.run_id,
           "outcome": outcome, "verdict": result.verdict,
           "failed_checks": [c.name for c in result.checks if c.verdict == "failed"],
           "window_reached": _window_reached(result), "missed_triggers": [], "signature": None,
           "seconds": round(seconds, 1), "elapsed_s": round(elapsed, 1), "error": (result.error or "")[:300] or None}
    if outcome == "inconclusive":
        row["missed_triggers"] = (missed_triggers(result) + undecided_checks(result)
                                  or ["(no trigger row: see the run's evidence check)"])
        summary.inconclusive_by_trigger.update(row["missed_triggers"])
    summary.runs.append(row)


def _finding(summary: ExploreSummary, opts: ExploreOptions, index: int, run_dir: Path, result: Any, scenario: Any,
             pre_seen: dict[tuple, str], findings_dir: Path, pool: Any, t0: float, left: Callable[[], float],
             say: Callable[[str], None]) -> None:
    """Diagnosis class, shrink (new pre-signatures only) and signature of one failed run."""
    from chaos.scenario.loader import load_scenario

    row = summary.runs[-1]
    diag = _diagnosis(run_dir)
    pre = signature_of(row["failed_checks"], diag, scenario)
    key = (pre.checks, pre.diagnosis, pre.faults)
    if key in pre_seen:
        sig_text = pre_seen[key]
        entry = summary.signatures[sig_text]
        entry["count"] += 1
        entry["runs"].append(str(run_dir))
        row["signature"] = sig_text
        say(f"[{index}] seen before: {sig_text}")
        return
    shrink: dict[str, Any] = {"done": False}
    stopped: KeyboardInterrupt | None = None
    final = scenario
    findings_dir.mkdir(parents=True, exist_ok=True)
    pending = findings_dir / f"pending-{index}.yaml"
    budget = min(opts.shrink_budget_s, max(0.0, left()))
    if opts.shrink_budget_s > 0 and budget > 0:
        from chaos.shrink.cli import run_shrink

        say(f"[{index}] shrinking (budget {budget:.0f}s)")
        s0 = time.monotonic()
        try:
            res, out = run_shrink(run_dir, reruns=opts.shrink_reruns, budget_s=budget, backend=opts.backend,
                                  out=pending, pool=pool, say=lambda m: say(f"[{index}] shrink {m}"))
            final = load_scenario(out)
            shrink = {"done": True, "verified": res.verified, "reruns": res.reruns, "original": res.original,
                      "final": res.final, "seconds": round(time.monotonic() - s0, 1),
                      "budget_spent": res.budget_spent}
        except KeyboardInterrupt as exc:  # a signal: the finding is kept unshrunk, then the exploration stops
            stopped = exc
            shrink = {"done": False, "error": "interrupted", "seconds": round(time.monotonic() - s0, 1)}
        except Exception as exc:  # noqa: BLE001 - one finding's shrink must not stop the exploration
            shrink = {"done": False, "error": f"{type(exc).__name__}: {exc}", "seconds": round(time.monotonic() - s0, 1)}
            say(f"[{index}] shrink failed: {shrink['error']}")
    # Which faults the failure needs: a planted bug's finding is run once more on the clean engine
    # (the control); a finding of the clean stack whose file still has faults, once more without
    # them. Either can show that the faults are not needed; the signature then drops them.
    probe: dict[str, Any] = {}
    if stopped is None:
        reproducer = pending if shrink.get("done") and pending.is_file() else Path(row["scenario_file"])
        sig_checks = signature_of(row["failed_checks"][:1], diag, final).checks
        try:
            if result.engine_bugs:
                probe = _control(reproducer, sig_checks, leaked_fields(result.checks), pool, opts, run_dir, index,
                                 say)
            elif opts.shrink_budget_s > 0 and final.faults() and left() > 0:  # part of the minimising
                probe = _without_faults(reproducer, sig_checks, leaked_fields(result.checks), pool, opts, run_dir,
                                        index, say)
        except KeyboardInterrupt as exc:
            stopped = exc
    with interrupts.deferred():
        entry = _sign(summary, opts, index, run_dir, result, row, diag, final, shrink, pending, key, pre_seen,
                      findings_dir, t0, say, probe)
    if stopped is not None:
        raise stopped


def _rerun(scenario: Any, label: str, pool: Any, opts: ExploreOptions, run_dir: Path,
           say: Callable[[str], None]) -> tuple[str, list[str], frozenset[str], Path]:
    """One more run of ``scenario`` on the pool's stack, under ``run_dir/control/``: (its outcome
    as :func:`classify` gives it, its failed checks, the leak fields its ``leaks`` check found
    held (:func:`leaked_fields`), its folder)."""
    from chaos.runner.leaks import restart_dirty
    from chaos.runner.run import run_scenario
    from chaos.stack.base import StackError, new_run_id
    from chaos.yamlsource import ConfigError

    run_id = new_run_id(f"{scenario.name}-{label}")
    cdir = run_dir / "control" / run_id
    try:
        stack = pool.acquire(Path(scenario.stack), scenario.stack_variables(), say=say)
        restart_dirty(stack, say)
    except (StackError, ConfigError) as exc:
        return f"error: {exc}", [], frozenset(), cdir
    res = run_scenario(scenario, stack, cdir, run_id=run_id, timeout_s=opts.timeout_s)
    pool.release(Path(scenario.stack), res)
    return classify(res), [c.name for c in res.checks if c.verdict == "failed"], leaked_fields(res.checks), cdir


def same_failure(checks: Iterable[str], leaked: Iterable[str], other_failed: Iterable[str],
                 other_leaked: Iterable[str]) -> bool:
    """Whether another run failed the way a finding did: one of the finding's ``checks`` failed
    there too, where a failed ``leaks`` counts only when every field the finding leaked
    (``leaked``, ``source.field``) leaked there too (an engine block leak is not the L2
    read-lock leak the clean engine shows beside it: seed 1 scenario 2, hold-blocks-on-abort)."""
    shared = set(checks) & set(other_failed)
    if "leaks" in shared and not set(leaked) <= set(other_leaked):
        shared.discard("leaks")
    return bool(shared)


def _control(reproducer: Path, checks: tuple[str, ...], leaked: frozenset[str], pool: Any, opts: ExploreOptions,
             run_dir: Path, index: int, say: Callable[[str], None]) -> dict[str, Any]:
    """A new finding of a run with planted bugs, its reproducer run once more on the clean engine:
    the failure is the bug's when the clean engine does not fail the same way
    (:func:`same_failure` of ``checks`` and ``leaked``, the finding's run's leak fields).

    Returns:
        The entry's fields ``clean_engine`` (the control's outcome), ``clean_engine_failed_checks``,
        ``clean_engine_leaked`` (its leak fields, sorted), ``clean_engine_run_dir``,
        ``attributed_to_bug`` (None when the control could not run to its checks) and
        ``faults_irrelevant`` (``"control"`` when attributed: the failure needs the bug, whatever
        faults the shrink kept).
    """
    from chaos.scenario.loader import load_scenario

    clean = load_scenario(reproducer)
    clean.engine.bugs = []
    say(f"[{index}] control: the finding on the clean engine")
    outcome, failed, control_leaked, cdir = _rerun(clean, "clean", pool, opts, run_dir, say)
    say(f"[{index}] control on the clean engine: {outcome}")
    fields = {"clean_engine": outcome, "clean_engine_failed_checks": failed,
              "clean_engine_leaked": sorted(control_leaked), "clean_engine_run_dir": str(cdir)}
    if outcome.startswith("error"):
        return {**fields, "attributed_to_bug": None}
    # The bug's when the clean engine does not fail the same way (its own fault window may go
    # unreached there: a wrong output after a hit does not need the fault); not when it does;
    # unknown when the control could not run to its checks.
    attributed = (None if outcome in ("error", "interrupted")
                  else not same_failure(checks, leaked, failed, control_leaked))
    return {**fields, "attributed_to_bug": attributed, "faults_irrelevant": "control" if attributed else None}


def _without_faults(reproducer: Path, checks: tuple[str, ...], leaked: frozenset[str], pool: Any,
                    opts: ExploreOptions, run_dir: Path, index: int, say: Callable[[str], None]) -> dict[str, Any]:
    """A new finding of the clean stack whose reproducer has faults, run once more with every
    fault removed (and no trigger of its own left to miss).

    Returns:
        ``without_faults`` (that run's outcome), ``without_faults_failed_checks``,
        ``without_faults_run_dir`` and ``faults_irrelevant`` (``"no-fault rerun"`` when it failed
        the same way again, :func:`same_failure` of ``checks`` and ``leaked``: the failure is the
        stack's own, the faults were by the way).
    """
    from chaos.scenario.loader import load_scenario

    bare = load_scenario(reproducer)
    for phase in bare.phases:
        phase.faults = []
    say(f"[{index}] the finding once more without its faults")
    outcome, failed, rerun_leaked, cdir = _rerun(bare, "nofault", pool, opts, run_dir, say)
    say(f"[{index}] without its faults: {outcome}")
    needless = outcome == "failed" and same_failure(checks, leaked, failed, rerun_leaked)
    return {"without_faults": outcome, "without_faults_failed_checks": failed, "without_faults_run_dir": str(cdir),
            "faults_irrelevant": "no-fault rerun" if needless else None}


def _sign(summary: ExploreSummary, opts: ExploreOptions, index: int, run_dir: Path, result: Any, row: dict,
          diag: str, final: Any, shrink: dict, pending: Path, key: tuple, pre_seen: dict[tuple, str],
          findings_dir: Path, t0: float, say: Callable[[str], None], probe: dict[str, Any]) -> dict | None:
    """Record the signature of a finding (new: its file under findings/; seen: one more count).
    ``probe``: what :func:`_control` or :func:`_without_faults` found (its fields go into a new
    entry; ``faults_irrelevant`` drops the fault kinds from the signature).
    Returns the new signature's entry, None for one seen before."""
    # The finding's check: the run's first failed check, the one its shrink targets (chaos/shrink);
    # the others it failed by the way are in the entry's failed_checks.
    sig: Signature = signature_of(row["failed_checks"][:1], diag, final,
                                  faults_irrelevant=bool(probe.get("faults_irrelevant")))
    text = sig.text()
    pre_seen[key] = text
    row["signature"] = text
    if text in summary.signatures:
        entry = summary.signatures[text]
        entry["count"] += 1
        entry["runs"].append(str(run_dir))
        pending.unlink(missing_ok=True)
        return None
    target = findings_dir / f"{sig.slug()}.yaml"
    if shrink.get("done") and pending.is_file():
        pending.replace(target)
    else:  # no shrunk file: the generated scenario, as it ran, is the reproducer
        shutil.copyfile(row["scenario_file"], target)
        _relink_stack(target, Path(row["scenario_file"]).parent)
    # the parts of the stack the reproducer's faults act on (none when it needs no fault)
    targets = fault_targets(final, summary.stack) if sig.faults else frozenset()
    marks_dir, started_at, planted = run_dir, getattr(result, "started_at", None), bool(result.engine_bugs)
    run_leaked = leaked = leaked_fields(result.checks)
    if probe.get("attributed_to_bug") is False and probe.get("clean_engine_run_dir"):
        # The clean engine failed it too (the control): a failure of the stack, not of the planted
        # bug, which a shipped finding may be; its marks are looked for in the control's logs
        # (seed 1 scenarios 2 and 8 with planted bugs: the slow and frozen L2 read-lock leaks).
        marks_dir = Path(probe["clean_engine_run_dir"])
        started_at, planted = _started_at(marks_dir), False
        leaked = frozenset(probe.get("clean_engine_leaked") or ())
    known = match_known(sig, opts.known, planted_bugs=planted, stack=Path(summary.stack).stem,
                        logs=_run_logs(summary.stack, marks_dir, started_at), targets=targets, leaked=leaked)
    summary.signatures[text] = {
        "signature": text, "checks": list(sig.checks), "failed_checks": list(row["failed_checks"]),
        "diagnosis": sig.diagnosis, "faults": list(sig.faults), "leaked": sorted(run_leaked),
        "count": 1, "first_run_index": index, "first_elapsed_s": row["elapsed_s"],
        "first_run_dir": str(run_dir), "scenario": str(target), "shrink": shrink,
        "known": known.name if known else None, "known_file": known.file if known else None,
        "engine_bugs": list(result.engine_bugs), "runs": [str(run_dir)],
        "clean_engine": None, "attributed_to_bug": None, "faults_irrelevant": None,
        "reproducer_faults": sorted({f.kind for _p, _i, f in final.faults()}), **probe,
    }
    say(f"[{index}] new signature: {text}" + (f" (known: {known.name})" if known else "") + f" -> {target}")
    return summary.signatures[text]


def _started_at(run_dir: Path) -> str | None:
    """A run's ``started_at`` (its ``result.json``); None when it has none or cannot be read."""
    try:
        return json.loads((run_dir / "result.json").read_text()).get("started_at")
    except (OSError, ValueError, AttributeError):
        return None


def _run_logs(stack: str, run_dir: Path, started_at: str | None) -> Callable[[str], str]:
    """service (a stack role or a compose service) -> what it logged during the run of
    ``run_dir`` (its collected ``logs/<service>.log`` from ``started_at``, the run's
    ``result.started_at``, on), for the ``xfail.marks`` of known findings; "" for a service the
    stack lacks or a log not collected."""
    from chaos.probes import resolve_service
    from chaos.stack.spec import load_stack

    try:
        settings = load_stack(Path(stack), require_commands=False, allocate_ports=False).settings
    except Exception:  # noqa: BLE001 - the stack ran this exploration; roles then are service names
        settings = None

    def logs(service: str) -> str:
        try:
            name = resolve_service(service, settings) if settings is not None else service
        except ValueError:
            return ""
        return run_log_window(run_dir / "logs" / f"{name}.log", started_at)

    return logs


def _relink_stack(path: Path, was_in: Path) -> None:
    """A copied scenario file's relative ``stack:`` made relative to its new folder."""
    import yaml

    data = yaml.safe_load(path.read_text())
    stack = Path(data["stack"])
    if not stack.is_absolute():
        stack = (was_in / stack).resolve()
    data["stack"] = os.path.relpath(stack, path.parent.resolve())
    path.write_text(yaml.safe_dump(data, sort_keys=False, default_flow_style=None, width=100))


def write_html(summary: ExploreSummary) -> Path:
    """``index.html`` of the exploration: counts, signatures (count, first found, known, the
    shrunk file) and every run with a link to its report."""
    import jinja2

    env = jinja2.Environment(loader=jinja2.PackageLoader("chaos.explore", "templates"),
                             autoescape=jinja2.select_autoescape(["html", "j2"]))
    folder = summary.folder

    def rel(p: str | None) -> str:
        if not p:
            return ""
        return os.path.relpath(Path(p).resolve(), folder.resolve())

    html = env.get_template("explore.html.j2").render(s=summary.as_dict(), rel=rel)
    path = folder / "index.html"
    path.write_text(html)
    return path
