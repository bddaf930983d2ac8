"""Which windows of a scenario nothing proves, found before anything runs (``kvchaos validate``).

    each fault ──> trigger declared ............................ proven by it (no warning)
               ──> trigger: none (+ reason) .................... warning: not proven, the verdict
                                                                  is "passed (window not proven)"
               ──> no trigger: its kind's default (chaos/faults/base.py DefaultTrigger)
                      needs a capability the stack lacks ....... warning: the run will be
                                                                  inconclusive
                      a request in flight while in place, in a
                      phase that sends none (or after its
                      requests) ............................... warning: cannot be reached
                      a request in flight at or after it, with
                      no request in this phase or a later one .. warning: cannot be reached
    each phase ──> trigger: none (+ reason) .................... warning, as for a fault
    faults but no `evidence` check ............................. warning: the runner adds it

Each warning is ``(path in the scenario file, message)``; chaos/scenario/loader.py turns the
path into the file's line.
"""

from __future__ import annotations

from chaos.faults import registry as fault_registry
from chaos.scenario.model import Scenario

__all__ = ["window_warnings"]

Path = tuple[str | int, ...]


def _need_met(capability: str, have: set[str]) -> bool:
    return any(alt in have for alt in capability.split("|"))


def window_warnings(scenario: Scenario, capabilities: set[str] | None = None) -> list[tuple[Path, str]]:
    """Every fault and phase of ``scenario`` whose window nothing will prove.

    Args:
        scenario: a validated scenario.
        capabilities: what the stack it runs on offers (chaos/stack/capabilities.py); None: not
            known (the capability warnings are left out).
    Returns:
        ``[(path, message)]`` in file order; empty when every window has a trigger that can be
        reached.
    """
    out: list[tuple[Path, str]] = []
    later_requests = [sum(scenario.phase_requests(q) for q in scenario.phases[i:])
                      for i in range(len(scenario.phases))]
    for p, phase in enumerate(scenario.phases):
        if phase.window_unproven:
            out.append((("phases", p, "trigger"), f"phase {phase.name!r} says `trigger: none` ({phase.reason}): "
                        "nothing proves its window; a run whose checks pass is 'passed (window not proven)', "
                        "exit 5"))
        for f, fault in enumerate(phase.faults):
            path: Path = ("phases", p, "faults", f)
            who = f"fault {fault.id!r} ({fault.kind})"
            if fault.window_unproven:
                out.append((path + ("trigger",), f"{who} says `trigger: none` ({fault.reason}): nothing proves "
                            "its window; a run whose checks pass is 'passed (window not proven)', exit 5"))
                continue
            if fault.conditions:
                continue
            default = fault_registry.get(fault.kind).default_trigger(fault)
            hint = "declare a `trigger` that this stack can see, or `trigger: none` with a `reason`"
            if capabilities is not None:
                lacking = sorted(n for n in default.needs if not _need_met(n, capabilities))
                if lacking:
                    out.append((path, f"{who}: its default trigger ({default.text}) needs {', '.join(lacking)}, "
                                f"which the stack does not offer: the run will be inconclusive; {hint}"))
                    continue
            if default.basis == "requests_in_place" and (scenario.phase_requests(phase) == 0
                                                         or fault.after == "requests"):
                why = ("its phase sends no request" if scenario.phase_requests(phase) == 0
                       else "it starts after its phase's requests are done")
                out.append((path, f"{who}: its default trigger ({default.text}) cannot be reached: {why}; "
                            f"the run will be inconclusive; {hint}"))
            elif default.basis == "requests_from_apply" and later_requests[p] == 0:
                out.append((path, f"{who}: its default trigger ({default.text}) cannot be reached: neither "
                            f"its phase nor a later one sends a request; the run will be inconclusive; {hint}"))
    if scenario.checks.evidence is None and any(p.faults or p.window_unproven for p in scenario.phases):
        out.append((("checks",), "the scenario has faults but no `evidence` check, which proves their windows: "
                    "the runner runs it anyway (add `evidence: {}` to say so)"))
    return out
