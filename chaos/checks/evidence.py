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

A fault that declares no ``trigger`` is judged by its kind's **default trigger**
(chaos/faults/base.py ``DefaultTrigger``, recorded by the runner on the apply op; for a history
without that record, the kind's default from the params recorded at apply): its own
evidence, a request of the workload in flight while it was in place, or one in flight when it
took effect or sent after it; reported as "trigger (default for <kind>): ...".

A fault that did not act, a trigger not reached or a timing premise broken makes the run
inconclusive ("unknown"),
never "passed": the scenario did not test what its description claims. This check never
answers "failed": a window not reached says nothing about the system under test. A fault or
phase that says ``trigger: none`` (with a ``reason``) leaves its window unproven: the check
passes and lists it under ``details.unproven``, and the run's verdict is "passed (window not
proven)" (chaos/report/result.py), never plain passed. So is a fault of a kind this kvchaos
does not know, with no trigger recorded.
"""

from __future__ import annotations

from typing import Any, Sequence

from chaos.checks.config import EvidenceConfig
from chaos.checks.registry import coerce_config, register
from chaos.checks.requests import FaultRecord, RequestRecord, faults, op_dicts, requests
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


def _in_flight(r: RequestRecord, start: float, end: float | None) -> bool:
    """Sent before ``end`` (None: no end) and not answered before ``start``."""
    return (end is None or r.invoke_time < end) and (r.end_time is None or r.end_time > start)


def default_for(f: FaultRecord) -> dict[str, Any] | None:
    """The default trigger of fault ``f``, as the runner recorded it on the fault's apply op
    (chaos/faults/base.py ``Fault.default_trigger``); None for ``trigger: none``, a declared
    trigger, or a history recorded before defaults existed (checks sit beside faults in the
    layers and never import them: the runner, above both, records what a kind's default is)."""
    if f.params.get("trigger") == "none" or f.trigger is not None:
        return None
    return f.default_trigger


def judge_default(default: dict[str, Any], f: FaultRecord, reqs: Sequence[RequestRecord]) -> dict[str, Any]:
    """Whether fault ``f`` reached its kind's default trigger.

    Args:
        default: the runner's record ``{"kind", "basis", "text"}`` (chaos/faults/base.py
            DefaultTrigger.as_record); basis ``evidence``, ``requests_in_place`` or
            ``requests_from_apply``.
        f: the fault, with its apply/heal times (s since run start) and evidence.
        reqs: the run's requests (chaos/checks/requests.py).
    Returns:
        ``{"default": kind, "basis", "text", "reached": bool, "seen": str, "request_ids": [...]}``
        (``request_ids``: up to 10 requests that met the fault, for the request bases).
    """
    basis = default.get("basis")
    out: dict[str, Any] = {"default": default.get("kind") or f.kind, "basis": basis,
                           "text": default.get("text") or ""}
    if basis == "evidence":
        key = default.get("evidence_field")
        value = (f.evidence or {}).get(key) if key else None
        field_ok = key is None or (value is True or (isinstance(value, (int, float)) and not isinstance(value, bool)
                                                     and value > 0))
        seen = ("its evidence says it did not bite" if not f.bit
                else f"its evidence has no {key} ({key}={value})" if not field_ok else "its evidence says it bit")
        out.update(reached=f.bit and field_ok, seen=seen)
        return out
    if basis not in ("requests_in_place", "requests_from_apply"):
        out.update(reached=False, seen=f"unknown basis {basis!r}")
        return out
    if f.applied_at is None or f.apply_outcome != "ok":
        out.update(reached=False, seen="the fault was never in place")
        return out
    end = f.healed_at if basis == "requests_in_place" else None
    met = [r for r in reqs if _in_flight(r, f.applied_at, end)]
    where = "while it was in place" if basis == "requests_in_place" else "when it took effect or after"
    out.update(reached=bool(met), request_ids=[r.request_id for r in met[:10]],
               seen=f"{len(met)} request(s) in flight {where}" if met
               else f"no request of the workload was in flight {where}")
    return out


def phase_triggers(history: Sequence[Op | dict[str, Any]]) -> list[dict[str, Any]]:
    """The phase triggers the runner recorded: ``[{"phase", "reached", "conditions", ...}]``."""
    return [{"phase": op.get("phase", ""), **(op.get("value") or {})} for op in op_dicts(history)
            if op.get("process") == "nemesis" and op.get("f") == "trigger"]


def _label(row: dict[str, Any]) -> str:
    if "fault_id" not in row:
        return f"phase {row['phase']}"
    label = (f"{row['kind']} {row['fault_id']}".strip() if row["kind"] != row["fault_id"] else row["fault_id"])
    return f"{label} (phase {row['phase']})"


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
    """Require `bit: true` in every fault's evidence and every trigger (declared, or the kind's
    default) reached.

    Args:
        history: the run's ops; nemesis apply/heal ops, phase `trigger` ops and the requests
            (for default triggers) are read.
        snapshots: unused.
        config: EvidenceConfig (no settings) or None.
    Returns:
        CheckResult; details: `faults` (list of {fault_id, kind, phase, applied_at, healed_at,
        evidence, bit, acted, trigger, trigger_reached, default_trigger, unproven, problem};
        `trigger_reached` None when nothing proves the window), `phases` (list of {phase,
        trigger, trigger_reached, problem}, then one {phase, window, window_kept, problem} per
        ``ends_within``) and `unproven` (one line per fault or phase whose window nothing
        proves: ``trigger: none`` and its reason). Passed with `unproven` not empty: the run's
        verdict is "passed (window not proven)".
    """
    coerce_config(config, EvidenceConfig)
    fs = faults(history)
    defaults = {f.fault_id: default_for(f) for f in fs}
    reqs = requests(history) if any(defaults.values()) else []
    rows = []
    unproven: list[str] = []
    for f in fs:
        problem = _why_not(f)
        default = None
        none = f.params.get("trigger") == "none"
        recorded = defaults[f.fault_id]
        if f.trigger is not None:
            reached: bool | None = f.trigger.get("reached") is True
            if problem is None and not reached:
                problem = "trigger " + _unreached(f.trigger or {})
        elif recorded is not None:
            default = judge_default(recorded, f, reqs)
            reached = default["reached"]
            if problem is None and not reached:
                problem = f"trigger (default for {default['default']}) not reached: {default['text']} ({default['seen']})"
        else:
            reached = None
        row = {"fault_id": f.fault_id, "kind": f.kind, "phase": f.phase, "applied_at": f.applied_at,
               "healed_at": f.healed_at, "evidence": f.evidence, "bit": f.bit, "acted": f.bit,
               "trigger": f.trigger, "trigger_reached": reached, "default_trigger": default,
               "unproven": None, "problem": problem}
        if reached is None:
            row["unproven"] = (f"trigger: none ({f.params.get('reason') or 'no reason given'})" if none
                               else f"no trigger declared and no default known for kind {f.kind!r}")
            unproven.append(f"{_label(row)}: {row['unproven']}")
        rows.append(row)
    phases = []
    for t in phase_triggers(history):
        if t.get("none"):
            row = {"phase": t["phase"], "trigger": t, "trigger_reached": None, "problem": None,
                   "unproven": f"trigger: none ({t.get('reason') or 'no reason given'})"}
            unproven.append(f"{_label(row)}: {row['unproven']}")
            phases.append(row)
            continue
        reached = t.get("reached") is True
        phases.append({"phase": t["phase"], "trigger": t, "trigger_reached": reached,
                       "problem": None if reached else "trigger " + _unreached(t)})
    triggers = [r for r in rows if r["trigger_reached"] is not None] + \
        [p for p in phases if p["trigger_reached"] is not None]
    windows = []
    for w in phase_windows(history):
        kept = w.get("reached") is True
        windows.append({"phase": w["phase"], "window": w, "window_kept": kept,
                        "problem": None if kept else _missed(w)})
    phases = phases + windows
    details = {"faults": rows, "phases": phases, "unproven": unproven}
    reached_n = sum(1 for r in triggers if r["trigger_reached"])
    defaults_n = sum(1 for r in rows if r.get("default_trigger") is not None)
    trig_text = (f"triggers reached: {reached_n} of {len(triggers)}"
                 + (f" ({defaults_n} the kind's default)" if defaults_n else "")) if triggers else "no trigger"
    if windows:
        trig_text += f"; timing premises kept: {sum(1 for w in windows if w['window_kept'])} of {len(windows)}"
    if unproven:
        trig_text += f"; windows not proven: {len(unproven)} ({'; '.join(unproven)})"
    if not fs and not phases:
        return CheckResult(name=NAME, verdict="passed", summary="no faults and no trigger in this scenario",
                           details=details)
    not_acted = [r for r in rows if r["problem"] and not r["acted"]]
    acted_text = (f"faults acted: {len(rows) - len(not_acted)} of {len(rows)}" if rows else "no faults")
    dull = [r for r in rows if r["problem"]] + [p for p in phases if p["problem"]]
    if dull:
        first = dull[0]
        return CheckResult(
            name=NAME, verdict="unknown",
            summary=f"inconclusive: {acted_text}; {trig_text}; {_label(first)}: {first['problem']}",
            details=details)
    names = f" ({', '.join(r['fault_id'] for r in rows)})" if rows else ""
    return CheckResult(name=NAME, verdict="passed", summary=f"{acted_text}{names}; {trig_text}", details=details)


def unproven_windows(checks: Sequence[Any]) -> list[str]:
    """The windows nothing proved in a run whose `evidence` check ran (its
    ``details.unproven``): ``[]`` when every window was proven or the check did not run."""
    for c in checks:
        if getattr(c, "name", None) == NAME:
            return list((getattr(c, "details", None) or {}).get("unproven") or [])
    return []
