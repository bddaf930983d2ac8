"""Delta debugging over the scenario model: the smallest scenario that still fails the same check.

    failing run (result.json: scenario file, engine bugs, failed check)
      └─> start: the scenario with only that check, every phase's requests explicit
          └─> passes of reductions, in a fixed order, each candidate run on one reused stack
              (chaos/runner/stacks.py StackPool): accepted when the check fails in every one
              of ``search_reruns`` runs; each pass runs to its fixpoint, then the next pass
              works on the smaller scenario
                 phases (keep one / drop one) · requests (every phase at 1, then per phase)
                 · merge a phase into the one before (its faults after that phase's requests)
                 · max_tokens · faults (drop)
                 · fault windows (start 0, halve) · families · prefix lengths · suffix tokens
                 · concurrency · turns · tenants · streaming · phase durations
              rounds of passes until one changes nothing; a change that passed is not tried
              again until a last round retries them all (for a 1-minimal result)
              with planted bugs, an accepted candidate must also pass on the clean engine
              (a control run): the search must not slip to a scenario failing on its own
          └─> final: the result must fail the check in ``reruns`` of ``reruns`` runs, else the
              previous accepted candidate is tried (newest first)
      ─> YAML (validates and runs as a normal scenario)

Deterministic: candidates come in a fixed order and the scenario keeps its seed, so two shrinks
of one run give the same file (when the runs they make fail the same way). Bounded by a time
budget: when it is spent the smallest candidate accepted so far is verified and written.

Ideas from Zeller's ddmin (drop halves, then single items) and Hypothesis' shrinker (each pass
tries the smallest value first).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from chaos.scenario.model import Scenario

Candidate = tuple[str, Scenario]


@dataclass
class ShrinkStep:
    """One candidate tried: what it changed, whether it still failed, its runs' seconds."""

    change: str
    accepted: bool
    runs: list[float] = field(default_factory=list)
    note: str = ""


def size(s: Scenario) -> dict[str, Any]:
    """Requests (all phases), phases and faults of a scenario."""
    return {"requests": sum(s.phase_requests(p) for p in s.phases), "phases": len(s.phases),
            "faults": sum(len(p.faults) for p in s.phases)}


def _copy(s: Scenario) -> Scenario:
    c = s.model_copy(deep=True)
    c._source = s.source  # type: ignore[attr-defined]
    c._locator = None  # type: ignore[attr-defined]
    return c


def normalise(s: Scenario, check: str) -> Scenario:
    """The shrink's start: only the target ``check`` (plus its inputs), every phase's request
    count explicit (so each phase shrinks on its own). Triggers feed only the ``evidence``
    check: unless that is the target they are dropped with it (a trigger watch changes nothing
    the stack does)."""
    c = _copy(s)
    keep = {check}
    cfg = {name: getattr(c.checks, name) for name in c.checks.enabled() if name in keep}
    c.checks = type(c.checks).model_validate({k: (v.model_dump() if v is not None else {}) for k, v in cfg.items()})
    for p in c.phases:
        p.requests = c.phase_requests(p)
        if check != "evidence":
            p.trigger = []
            for f in p.faults:
                f.trigger = []
    c.name = (c.name + "-shrunk")[:100]
    return c


def _smaller_ints(n: int, floor: int = 1) -> list[int]:
    """1, 2, 4, ... below n (smallest first), at least ``floor``."""
    out, k = [], floor
    while k < n:
        out.append(k)
        k *= 2
    return out


def _phases(s: Scenario) -> Iterator[Candidate]:
    """Keep one phase (the last first: failures tend to show late), then drop one."""
    n_phases = len(s.phases)
    if n_phases > 1:
        for i in reversed(range(n_phases)):
            c = _copy(s)
            c.phases = [c.phases[i]]
            yield f"keep only phase {s.phases[i].name}", c
        for i in range(n_phases):
            c = _copy(s)
            del c.phases[i]
            yield f"drop phase {s.phases[i].name}", c


def _requests(s: Scenario) -> Iterator[Candidate]:
    """Every phase at one request at once (ddmin's big step: most scenarios need one request
    where a fault or a check looks), then requests per phase, smallest first. 0 only for a
    phase that holds faults or a minimum duration (without either, 0 requests is "drop phase",
    already tried by :func:`_phases`)."""
    counts = [s.phase_requests(p) for p in s.phases]
    if sum(1 for n in counts if n > 1) > 1:
        c = _copy(s)
        for p, n in zip(c.phases, counts):
            p.requests = min(n, 1)
        yield f"every phase at most 1 request ({counts} -> {[min(n, 1) for n in counts]})", c
    for pi, p in enumerate(s.phases):
        n = counts[pi]
        holds = bool(p.faults) or p.duration is not None
        options = ([0] if n and len(s.phases) > 1 and holds else []) + _smaller_ints(n)
        for k in options:
            c = _copy(s)
            c.phases[pi].requests = k
            yield f"phase {p.name}: {n} -> {k} requests", c


def _merge(s: Scenario, windows: dict[str, float] | None = None) -> Iterator[Candidate]:
    """One phase fewer: a phase's faults move into the phase before it, applied once that
    phase's requests are done (``after: requests``, same ``start``), and its requests are
    dropped (the requests pass may already have taken them to 0). A fault with ``until: end``
    gets a ``duration``: the window it had in the caught run (``windows``: fault id -> seconds
    from apply to heal), else the phase's own length (its ``duration``, its longest fault), at
    least 0.5 s. Last phase first. E.g. warm / crash (kill LMCache) / recover becomes warm
    (kill LMCache after its requests) / recover."""
    windows = windows or {}
    for i in reversed(range(1, len(s.phases))):
        src = s.phases[i]
        if not src.faults:
            continue
        c = _copy(s)
        into = c.phases[i - 1]
        length = max([src.duration or 0.0] + [f.end_s() or 0.0 for f in src.faults])
        for f in c.phases[i].faults:
            if f.until is not None:
                f.until = None
                f.duration = round(max(0.5, windows.get(f.id, length)), 3)
            f.after = "requests"
            # Nothing left to hold: the phase's requests are done before the fault starts (and
            # the model refuses `hold_requests` with `after: requests`).
            f.hold_requests = False
            into.faults.append(f)
        del c.phases[i]
        n = s.phase_requests(src)
        yield (f"merge phase {src.name} into {into.name} (its faults after {into.name}'s requests"
               + (f", its {n} requests dropped)" if n else ")")), c


def _max_tokens(s: Scenario) -> Iterator[Candidate]:
    """Fewer generated tokens: every later candidate runs faster."""
    w = s.workload
    for k in _smaller_ints(w.max_tokens):
        c = _copy(s)
        c.workload.max_tokens = k
        yield f"max_tokens {w.max_tokens} -> {k}", c


def _faults(s: Scenario) -> Iterator[Candidate]:
    """Drop every fault, then one at a time."""
    all_faults = [(pi, fi) for pi, p in enumerate(s.phases) for fi in range(len(p.faults))]
    if len(all_faults) > 1:
        c = _copy(s)
        for p in c.phases:
            p.faults = []
        yield "drop every fault", c
    for pi, fi in all_faults:
        c = _copy(s)
        name = c.phases[pi].faults[fi].name
        del c.phases[pi].faults[fi]
        yield f"drop fault {name}", c


def _windows(s: Scenario) -> Iterator[Candidate]:
    """Fault windows: start at 0, half the duration."""
    for pi, p in enumerate(s.phases):
        for fi, f in enumerate(p.faults):
            if f.start > 0:
                c = _copy(s)
                c.phases[pi].faults[fi].start = 0.0
                yield f"fault {f.name}: start at 0s", c
            if f.duration is not None and f.duration > 1.0:
                c = _copy(s)
                c.phases[pi].faults[fi].duration = round(max(0.5, f.duration / 2), 3)
                yield f"fault {f.name}: duration {f.duration:g}s -> {c.phases[pi].faults[fi].duration:g}s", c


def _workload(s: Scenario) -> Iterator[Candidate]:
    """Families, prefix lengths, suffix tokens, concurrency (last: it makes runs longer),
    turns, tenants, streaming."""
    w = s.workload
    for k in _smaller_ints(w.families):
        c = _copy(s)
        c.workload.families = k
        yield f"families {w.families} -> {k}", c
    lengths = w.prefix_tokens if isinstance(w.prefix_tokens, list) else [w.prefix_tokens]
    if len(lengths) > 1:
        for v in lengths:
            c = _copy(s)
            c.workload.prefix_tokens = [v]
            yield f"prefix_tokens {lengths} -> [{v}]", c
    if w.suffix_tokens > 0 and w.turns == 1:
        for k in [0] + _smaller_ints(w.suffix_tokens):
            c = _copy(s)
            c.workload.suffix_tokens = k
            yield f"suffix_tokens {w.suffix_tokens} -> {k}", c
    for k in _smaller_ints(w.concurrency):
        c = _copy(s)
        c.workload.concurrency = k
        yield f"concurrency {w.concurrency} -> {k}", c
    if w.turns > 1:
        c = _copy(s)
        c.workload.turns = 1
        yield f"turns {w.turns} -> 1", c
    if isinstance(w.tenants, int) and w.tenants > 2:
        c = _copy(s)
        c.workload.tenants = 2
        yield f"tenants {w.tenants} -> 2", c
    if w.stream:
        c = _copy(s)
        c.workload.stream = False
        yield "no streaming", c


def _durations(s: Scenario) -> Iterator[Candidate]:
    """Phases without their minimum duration."""
    for pi, p in enumerate(s.phases):
        if p.duration is not None:
            c = _copy(s)
            c.phases[pi].duration = None
            yield f"phase {p.name}: no minimum duration", c


#: The reduction passes, in order: first what the size counts (phases, then requests), then
#: what makes each later run cheaper (max_tokens), then the rest.
PASSES: tuple[Callable[..., Iterator[Candidate]], ...] = (
    _phases, _requests, _merge, _max_tokens, _faults, _windows, _workload, _durations)


#: The passes whose candidates get a control run when accepted: taking requests, phases or
#: faults away can leave a scenario that fails on its own (nothing stored before the phase that
#: must hit); fewer tokens, families or prefix lengths cannot turn a clean engine's pass into a
#: failure of a check on their own.
CONTROLLED = (_phases, _requests, _merge, _faults, _windows, _durations)


def reductions(s: Scenario, windows: dict[str, float] | None = None) -> Iterator[Candidate]:
    """Every single-step reduction of ``s``, pass by pass (:data:`PASSES`), in a fixed order
    (``windows``: see :func:`_merge`)."""
    for make in PASSES:
        yield from (make(s, windows) if make is _merge else make(s))


def _valid(c: Scenario) -> bool:
    """The candidate still validates as a scenario (phase names, hit_recovery phases, ...)."""
    try:
        Scenario.model_validate(c.model_dump(mode="json", exclude_none=True), context={"check_paths": False})
    except ValueError:
        return False
    return any(c.phase_requests(p) for p in c.phases)


@dataclass
class ShrinkResult:
    """What a shrink found.

    Attributes:
        scenario: the smallest scenario that failed the check in ``verified`` of ``reruns`` runs.
        original, final: their sizes (:func:`size`).
        steps: every candidate tried.
        verified: reruns of the final scenario that failed the check.
        reruns: reruns asked for.
        run_seconds: seconds of one run of the final scenario (mean of the verification runs).
        seconds: the shrink's wall time.
        budget_spent: the time budget ended the search.
    """

    scenario: Scenario
    original: dict[str, Any]
    final: dict[str, Any]
    steps: list[ShrinkStep]
    verified: int
    reruns: int
    run_seconds: float
    seconds: float
    budget_spent: bool = False


def shrink(scenario: Scenario, check: str, fails: Callable[[Scenario], tuple[bool, float, str]], *,
           reruns: int = 3, search_reruns: int = 1, budget_s: float = 300.0,
           control: Callable[[Scenario], tuple[bool, float, str]] | None = None,
           windows: dict[str, float] | None = None, runs_at_least: int = 0,
           say: Callable[[str], None] = lambda _m: None) -> ShrinkResult:
    """Shrink ``scenario`` while ``fails`` says the check still fails.

    Args:
        scenario: the failing run's scenario (with the run's engine bugs).
        check: the check that must keep failing.
        fails: runs a scenario once; returns ``(the check failed, run seconds, note)``.
        reruns: final verification runs (all must fail).
        search_reruns: runs per candidate during the search (all must fail).
        budget_s: wall-time budget of the search (the final verification runs after it).
        runs_at_least: the search gets at least this many times the first run's seconds (the
            start, as it runs here: a cell whose candidates take a minute needs more than a
            fixed budget); 0: ``budget_s`` alone.
        control: runs a candidate without what is under test (a planted bug: the clean engine)
            and returns the same triple. The search can slip to a scenario that fails the check
            for a reason of its own (no request left to store what a later phase must hit: that
            fails ``hit_recovery`` on any engine); with a control, a candidate of a
            :data:`CONTROLLED` pass that fails is accepted only when its control run passes.
        windows: each fault's window in the caught run (fault id -> seconds from apply to
            heal), for :func:`_merge` (an ``until: end`` fault moved into another phase keeps
            the length it had).

    Returns:
        The :class:`ShrinkResult`.

    Raises:
        ValueError: the starting scenario does not fail the check in ``search_reruns`` runs.
    """
    t0 = time.monotonic()
    current = normalise(scenario, check)
    steps: list[ShrinkStep] = []

    def attempt(change: str, cand: Scenario, n: int, controlled: bool = True) -> bool:
        step = ShrinkStep(change=change, accepted=False)
        steps.append(step)
        for _ in range(n):
            failed, secs, note = fails(cand)
            step.runs.append(round(secs, 2))
            step.note = note
            if not failed:
                say(f"  {change}: passes ({note})")
                return False
        if control is not None and controlled:  # (the start was caught against a clean row)
            failed, secs, note = control(cand)
            step.runs.append(round(secs, 2))
            if failed:
                step.note = f"fails without the bug too ({note})"
                say(f"  {change}: {step.note}")
                return False
        step.accepted = True
        say(f"  {change}: still fails -> {size(cand)}")
        return True

    # A timing-dependent failure may need a few tries to show again: up to ``reruns``.
    if not any(attempt(f"start (only the target check), try {i + 1}", current, search_reruns, controlled=False)
               for i in range(reruns)):
        raise ValueError(f"the scenario does not fail {check} in {reruns} runs again; nothing to shrink")
    if runs_at_least and steps[-1].runs:
        budget_s = max(budget_s, runs_at_least * steps[-1].runs[-1])
    accepted = [current]
    tried: set[str] = set()  # a candidate met again (same model) is not run again
    # A change that did not fail (e.g. "drop fault kill-lmcache") is not tried again in later
    # rounds while the search still makes progress: its reason rarely goes away, and on a stack
    # each try is a whole run. The last round tries them all again, for a 1-minimal result.
    passed_changes: set[str] = set()
    spent = False
    strict = False
    while not spent:
        changed = False
        for make in PASSES:  # each pass to its fixpoint, then the next from the smaller scenario
            while not spent:
                hit = False
                for change, cand in (make(current, windows) if make is _merge else make(current)):
                    if time.monotonic() - t0 > budget_s:
                        spent = True
                        break
                    key = cand.model_dump_json()
                    if key in tried or (not strict and change in passed_changes) or not _valid(cand):
                        continue
                    tried.add(key)
                    if attempt(change, cand, search_reruns, controlled=make in CONTROLLED):
                        current = cand
                        accepted.append(cand)
                        changed = hit = True
                        break
                    passed_changes.add(change)
                if not hit:
                    break
        if not changed:
            if strict:
                break
            strict = True  # one more round, retrying every change that passed before
        else:
            strict = False
    # final verification, newest accepted first
    verified, run_s = 0, 0.0
    for cand in reversed(accepted):
        secs: list[float] = []
        ok = 0
        for _ in range(reruns):
            failed, s, _note = fails(cand)
            secs.append(s)
            if not failed:
                break
            ok += 1
        say(f"verify {size(cand)}: fails {ok} of {reruns}")
        if ok == reruns:
            current, verified, run_s = cand, ok, sum(secs) / len(secs)
            break
    else:
        current = accepted[0]  # nothing fails every rerun (flaky): report the start, verified 0
    return ShrinkResult(scenario=current, original=size(normalise(scenario, check)), final=size(current),
                        steps=steps, verified=verified, reruns=reruns, run_seconds=round(run_s, 2),
                        seconds=round(time.monotonic() - t0, 1), budget_spent=spent)
