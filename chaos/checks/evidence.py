"""evidence: every fault the nemesis applied really bit.

A latency toxic on a link nobody used, a kill of a process that had already exited, an L2
object corruption of a key never read: the scenario "passes" without testing anything. Each
fault records at heal an evidence dict (`{"bit": bool, ...}`: bytes delayed, objects
corrupted, requests preempted). A fault without `bit: true` makes the run inconclusive
("unknown"), never "passed"; a scenario whose fault never fired proves nothing.

Verdicts: unknown if some fault did not bite (or its apply failed, or it never healed, or it
recorded no evidence); passed when every fault bit or there were no faults. This check never
answers "failed": a fault that did not bite says nothing about the system under test.
"""

from __future__ import annotations

from typing import Any, Sequence

from chaos.checks.registry import coerce_config, register
from chaos.checks.requests import FaultRecord, faults
from chaos.checks.result import CheckResult
from chaos.checks.snapshots import Snapshots
from chaos.history import Op
from chaos.scenario.checks import EvidenceConfig

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


@register(NAME, EvidenceConfig)
def check(history: Sequence[Op | dict[str, Any]], snapshots: Snapshots,
          config: EvidenceConfig | dict[str, Any] | None = None) -> CheckResult:
    """Require `bit: true` in every fault's evidence.

    Args:
        history: the run's ops; nemesis apply/heal ops are read.
        snapshots: unused.
        config: EvidenceConfig (no settings) or None.
    Returns:
        CheckResult; details: `faults` (list of {fault_id, kind, phase, applied_at, healed_at,
        evidence, bit, problem}).
    """
    coerce_config(config, EvidenceConfig)
    fs = faults(history)
    rows = []
    for f in fs:
        rows.append({"fault_id": f.fault_id, "kind": f.kind, "phase": f.phase, "applied_at": f.applied_at,
                     "healed_at": f.healed_at, "evidence": f.evidence, "bit": f.bit, "problem": _why_not(f)})
    details = {"faults": rows}
    if not fs:
        return CheckResult(name=NAME, verdict="passed", summary="no faults in this scenario", details=details)
    dull = [r for r in rows if r["problem"]]
    if dull:
        first = dull[0]
        label = f"{first['kind']} {first['fault_id']}".strip() if first["kind"] != first["fault_id"] else first["fault_id"]
        return CheckResult(
            name=NAME, verdict="unknown",
            summary=(f"inconclusive: {len(dull)} of {len(fs)} faults did not bite; "
                     f"{label} (phase {first['phase']}): {first['problem']}"),
            details=details)
    return CheckResult(name=NAME, verdict="passed",
                       summary=f"all {len(fs)} faults bit: " + ", ".join(r["fault_id"] for r in rows),
                       details=details)
