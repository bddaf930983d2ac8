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
    aims at the engine's load-failure path (a trigger on a load-failure counter, or
    KV_LOAD_FAILURE_POLICY set) with L2-side faults only ...... warning: LMCache's prefetch absorbs
                                                                  them in MP mode
    tier_flush of l1 after an l2_fault_inject ................. warning: that fault's restarts of
                                                                  LMCache (apply, heal) empty L1

Each warning is ``(path in the scenario file, message)``; chaos/scenario/loader.py turns the
path into the file's line.
"""

from __future__ import annotations

from chaos.faults import registry as fault_registry
from chaos.scenario.model import Scenario

__all__ = ["window_warnings", "L2_SIDE_KINDS", "L2_TIERS"]

#: Fault kinds that act on an L2 tier only. In LMCache's MP mode a lookup prefetches the hit's L2
#: chunks into L1 before it answers; an L2 read that fails trims the hit there (LMCache 0.5.6
#: ``lmcache_mp_l2_prefetch_failure_chunks_total``), so the engine is told a shorter hit and never
#: sees a failed load: these faults cannot reach the engine's load-failure path.
L2_SIDE_KINDS = frozenset({"l2_corrupt", "l2_fault_inject", "disk_full"})
#: The tiers of ``tier_flush`` that are L2 (the same holds for a flush of them only).
L2_TIERS = frozenset({"redis", "fs"})
#: Services whose faults (kill, pause) act on an L2 tier only.
L2_SERVICES = frozenset({"redis"})

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
            default = fault_registry.get(fault.kind).default_trigger_beside(
                fault, [q for q in phase.faults if q is not fault])
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
    out.extend(_absorbed_by_prefetch(scenario))
    out.extend(_flush_after_restart(scenario))
    if scenario.checks.evidence is None and any(p.faults or p.window_unproven for p in scenario.phases):
        out.append((("checks",), "the scenario has faults but no `evidence` check, which proves their windows: "
                    "the runner runs it anyway (add `evidence: {}` to say so)"))
    return out


def _aims_at_load_failure(scenario: Scenario) -> str | None:
    """What says the scenario aims at the engine's load-failure path (None: nothing)."""
    conds = [c for p in scenario.phases for c in [*p.conditions, *(x for f in p.faults for x in f.conditions)]]
    for c in conds:
        names = [c.metric] if isinstance(c.metric, str) else list(c.metric or [])
        hit = next((n for n in names if "load_fail" in n), None)
        if hit:
            return f"its trigger on {hit}"
    if "KV_LOAD_FAILURE_POLICY" in scenario.variables:
        return "KV_LOAD_FAILURE_POLICY"
    return None


def _l2_side(fault) -> bool:
    if fault.kind in L2_SIDE_KINDS:
        return True
    if fault.kind == "tier_flush":
        return set(fault.tiers) <= L2_TIERS
    if fault.kind in ("kill", "pause"):
        return fault.service in L2_SERVICES
    return False


def _absorbed_by_prefetch(scenario: Scenario) -> list[tuple[Path, str]]:
    """A warning at each L2-side fault of a scenario that aims at the engine's load-failure path
    with no fault that can reach it (docs/reach.md, "L2 faults in LMCache's MP mode")."""
    aim = _aims_at_load_failure(scenario)
    faults = [(p, f, fault) for p, ph in enumerate(scenario.phases) for f, fault in enumerate(ph.faults)]
    if aim is None or not faults or not all(_l2_side(fault) for _p, _f, fault in faults):
        return []
    return [(("phases", p, "faults", f),
             f"fault {fault.id!r} ({fault.kind}) acts on L2 only, and the scenario aims at the engine's "
             f"load-failure path ({aim}): in LMCache's MP mode the lookup's prefetch absorbs an L2 failure "
             "(the hit is trimmed, the engine never sees a failed load); reach that path between lookup "
             "and retrieve instead: retrieve_fail, lmcache_call, a network fault on the engine-lmcache "
             "link, kill or pause of lmcache (docs/reach.md)")
            for p, f, fault in faults]


def _flush_after_restart(scenario: Scenario) -> list[tuple[Path, str]]:
    """A warning at each ``tier_flush`` of ``l1`` that comes after an ``l2_fault_inject``: that
    fault restarts LMCache at apply and again at heal, and a restarted LMCache has an empty L1,
    so unless requests store again in between, the flush finds nothing to flush (its window is
    not reached: inconclusive)."""
    out: list[tuple[Path, str]] = []
    inject: str | None = None
    for p, phase in enumerate(scenario.phases):
        for f, fault in enumerate(phase.faults):
            if fault.kind == "l2_fault_inject" and inject is None:
                inject = fault.id
            elif fault.kind == "tier_flush" and "l1" in fault.tiers and inject is not None:
                out.append((("phases", p, "faults", f),
                            f"fault {fault.id!r} (tier_flush of l1) comes after l2_fault_inject {inject!r}, which "
                            "restarts LMCache at apply and at heal: a restarted LMCache's L1 is empty, so unless "
                            "requests store again between that restart and this flush, it flushes nothing and "
                            "the run is inconclusive (docs/reach.md, LMCache)"))
    return out
