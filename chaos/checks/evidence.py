"""evidence: every fault the nemesis applied really acted, and every trigger was reached.

A latency toxic on a link nobody used, a kill of a process that had already exited, an L2
object corruption of a key never read: the scenario "passes" without testing anything. Two
questions, answered separately:

- **fault acted**: each fault records at heal an evidence dict (`{"bit": bool, ...}`: bytes
  delayed, objects corrupted, requests preempted);
- **trigger reached**: a fault (or a phase) that declares a `trigger` says what must be seen
  while it is in place for the scenario to have reached its failure window (a read failed, a
  lock was held when the request was cancelled); chaos/probes.py watched it and recorded what
  it saw on the heal record (a phase's: on a `trigger` record of the nemesis).

- **timing premise kept**: a phase with ``ends_within`` (a window that rests on a TTL or a
  timeout of the system under test) ended at most that long after the start of the phase it
  names; the runner recorded a `window` op at the phase's end.

A fault that did not act, a trigger not reached or a timing premise broken makes the run
inconclusive ("unknown"),
never "passed": the scenario did not test what its description claims. This check never
answers "failed": a window not reached says nothing about the system under test.
"""

from __future__ import annotations

from typing import Any, Sequence

from chaos.checks.config import EvidenceConfig
from chaos.checks.registry import coerce_config, register
from chaos.checks.requests import FaultRecord, faults, op_dicts
from chaos.checks.result import CheckResult
from chaos.checks.snapshots import Snapshots
from chaos.history import Op

NAME = "evidence"


def _why_not(f: FaultRecord) -> str | None:
    if f.apply_outcome in ("fail", "info"):
        return f"apply {f.apply_outcome}" + (f": {f.error}" if f.error else "")
    if f.applied_at is None:
        return "never applied"
    if f.heal_outcome is None:
        return "never healed, no evidence recorded"
    if f.evidence is None:
        return "no evidence recorded"
    if f.evidence.get("bit") is not True:
        extra = {k: v for k, v in f.evidence.items() if k != "bit"}
        return "did not bite" + (" (" + ", ".join(f"{k}={v}" for k, v in extra.items()) + ")" if extra else "")
    return None


def _unreached(trigger: dict[str, Any]) -> str:
    """The first applicable condition of ``trigger`` that was not reached, said with what was
    seen (or that none of its conditions applies on this stack: ``only_with``)."""
    conditions = trigger.get("conditions") or []
    if conditions and not any(c.get("applicable", True) for c in conditions):
        return ("not reached: no condition applies on this stack ("
                + "; ".join(str(c.get("condition")) for c in conditions) + ")")
    for c in conditions:
        if c.get("reached") or not c.get("applicable", True):
            continue
        seen = (f"matched {c.get('matched', 0)}" if c.get("probe") == "log"
                else f"increase {c.get('increase'):g}" if c.get("increase") is not None
                else f"max {c.get('max')}")
        errs = f"; errors: {c['errors'][-1]}" if c.get("errors") else ""
        note = f"; {c['note']}" if c.get("note") else ""
        return f"{c.get('condition')}: not reached ({seen}{note}{errs})"
    return "not reached"


def phase_triggers(history: Sequence[Op | dict[str, Any]]) -> list[dict[str, Any]]:
    """The phase triggers the runner recorded: ``[{"phase", "reached", "conditions", ...}]``."""
    return [{"phase": op.get("phase", ""), **(op.get("value") or {})} for op in op_dicts(history)
            if op.get("process") == "nemesis" and op.get("f") == "trigger"]


def phase_windows(history: Sequence[Op | dict[str, Any]]) -> list[dict[str, Any]]:
    """The timing premises (``ends_within``) the runner recorded, one per phase that declares
    one: ``[{"phase", "reached", "within_s", "since_phase", "took_s"}]``."""
    return [{"phase": op.get("phase", ""), **(op.get("value") or {})} for op in op_dicts(history)
            if op.get("process") == "nemesis" and op.get("f") == "window"]


def _missed(w: dict[str, Any]) -> str:
    took = w.get("took_s")
    since = w.get("since_phase")
    ref = "its own start" if since == w.get("phase") else f"the start of phase {since}"
    if took is None:
        return f"timing premise not measured: phase {since} never started"
    return (f"timing premise missed: ended {took:.1f}s after {ref}, later than ends_within "
            f"{w.get('within_s'):g}s (the window it rests on may have closed: the run is stretched)")


@register(NAME, EvidenceConfig)
def check(history: Sequence[Op | dict[str, Any]], snapshots: Snapshots,
          config: EvidenceConfig | dict[str, Any] | None = None) -> CheckResult:
    """Require `bit: true` in every fault's evidence and every declared trigger reached.

    Args:
        history: the run's ops; nemesis apply/heal ops and phase `trigger` ops are read.
        snapshots: unused.
        config: EvidenceConfig (no settings) or None.
    Returns:
        CheckResult; details: `faults` (list of {fault_id, kind, phase, applied_at, healed_at,
        evidence, bit, acted, trigger, trigger_reached, problem}; `trigger_reached` None when
        the fault declares no trigger) and `phases` (list of {phase, trigger, trigger_reached,
        problem}, then one {phase, window, window_kept, problem} per ``ends_within``).
    """
    coerce_config(config, EvidenceConfig)
    fs = faults(history)
    rows = []
    for f in fs:
        problem = _why_not(f)
        reached = None if f.trigger is None else f.trigger.get("reached") is True
        if problem is None and reached is False:
            problem = "trigger " + _unreached(f.trigger or {})
        rows.append({"fault_id": f.fault_id, "kind": f.kind, "phase": f.phase, "applied_at": f.applied_at,
                     "healed_at": f.healed_at, "evidence": f.evidence, "bit": f.bit, "acted": f.bit,
                     "trigger": f.trigger, "trigger_reached": reached, "problem": problem})
    phases = []
    for t in phase_triggers(history):
        reached = t.get("reached") is True
        phases.append({"phase": t["phase"], "trigger": t, "trigger_reached": reached,
                       "problem": None if reached else "trigger " + _unreached(t)})
    triggers = [r for r in rows if r["trigger_reached"] is not None] + phases
    windows = []
    for w in phase_windows(history):
        kept = w.get("reached") is True
        windows.append({"phase": w["phase"], "window": w, "window_kept": kept,
                        "problem": None if kept else _missed(w)})
    phases = phases + windows
    details = {"faults": rows, "phases": phases}
    reached_n = sum(1 for r in triggers if r["trigger_reached"])
    trig_text = f"triggers reached: {reached_n} of {len(triggers)}" if triggers else "no trigger declared"
    if windows:
        trig_text += f"; timing premises kept: {sum(1 for w in windows if w['window_kept'])} of {len(windows)}"
    if not fs and not phases:
        return CheckResult(name=NAME, verdict="passed", summary="no faults and no trigger in this scenario",
                           details=details)
    not_acted = [r for r in rows if r["problem"] and not r["acted"]]
    acted_text = (f"faults acted: {len(rows) - len(not_acted)} of {len(rows)}" if rows else "no faults")
    dull = [r for r in rows if r["problem"]] + [p for p in phases if p["problem"]]
    if dull:
        first = dull[0]
        if "fault_id" in first:
            label = (f"{first['kind']} {first['fault_id']}".strip() if first["kind"] != first["fault_id"]
                     else first["fault_id"])
            where = f"{label} (phase {first['phase']})"
        else:
            where = f"phase {first['phase']}"
        return CheckResult(
            name=NAME, verdict="unknown",
            summary=f"inconclusive: {acted_text}; {trig_text}; {where}: {first['problem']}",
            details=details)
    names = f" ({', '.join(r['fault_id'] for r in rows)})" if rows else ""
    return CheckResult(name=NAME, verdict="passed", summary=f"{acted_text}{names}; {trig_text}", details=details)
