"""What a scenario needs from the stack it runs on (chaos/stack/capabilities.py names).

    scenario ──> each fault: registry.get(kind).capability_needs(params)   phases[p].faults[f]
             ──> each check: checks registry .capability_needs(config)      checks.<name>
             ──> variables: var:NAME                                         variables.NAME
             ──> engine options: bugs -> engine.planted_bugs,               engine.<option>
                 prefix_caching -> var:KVCHAOS_ENGINE_PREFIX_CACHING, ...
             ──> workload.tenants > 1 -> engine.cache_salt                   workload.tenants
    ──> [Need(path, capability, who)] ── missing(needs, stack capabilities) ── what the stack lacks

A need ``"a|b"`` is met by either name. A trigger condition with ``only_with: X`` needs
what it probes only on stacks that offer X (``Need.when``; elsewhere it is not watched); a
trigger whose every condition is ``only_with`` needs one of their X (else it is never reached). The loader turns each missing need into a ConfigError
at the line of its path (chaos.scenario.loader.validate_against_stack).
"""

from __future__ import annotations

from dataclasses import dataclass

from chaos.faults import registry as fault_registry
from chaos.scenario.model import Scenario
from chaos.stack.capabilities import describe, variable_need

__all__ = ["Need", "scenario_needs", "missing", "need_met", "explain"]


@dataclass(frozen=True)
class Need:
    """One requirement of a scenario.

    Attributes:
        path: data path in the scenario file of what needs it (for the error's line).
        capability: the name (``"a|b"``: either).
        who: what needs it, for the message (``fault 'stall' (hook)``, ``check leaks``, ...).
    """

    path: tuple[str | int, ...]
    capability: str
    who: str
    #: Only a need on stacks that offer this capability (a trigger condition's or a fault's
    #: ``only_with``).
    when: str | None = None
    #: Only a need on stacks that do not offer this capability (a fault's ``unless_with``).
    unless: str | None = None


def scenario_needs(scenario: Scenario) -> list[Need]:
    """Every capability the scenario needs, in file order (faults, checks, variables, engine).

    Raises:
        KeyError: a fault kind or check name is not registered (cannot happen for a validated
            scenario).
    """
    from chaos.checks import registry as check_registry

    import chaos.checks  # noqa: F401  - registers every check

    out: list[Need] = []
    for p, f, fault in scenario.faults():
        cls = fault_registry.get(fault.kind)
        for cap in sorted(cls.capability_needs(fault)):
            out.append(Need(("phases", p, "faults", f), cap, f"fault {fault.id!r} ({fault.kind})",
                            when=fault.only_with, unless=fault.unless_with))
    owners = [(("phases", p, "faults", f, "trigger"), fault.conditions, f"the trigger of fault {fault.id!r}",
               fault.only_with, fault.unless_with) for p, f, fault in scenario.faults()]
    owners += [(("phases", p, "trigger"), phase.conditions, f"the trigger of phase {phase.name!r}", None, None)
               for p, phase in enumerate(scenario.phases)]
    for path, conditions, who, gate, unless in owners:
        for i, cond in enumerate(conditions):
            for cap in trigger_needs(cond):
                # a condition of a gated fault: needed only where both the fault and it apply
                when = cond.only_with or gate
                if cond.only_with and gate and cond.only_with != gate:
                    when = f"{gate}&{cond.only_with}"
                out.append(Need(path + (i,), cap, who, when=when, unless=unless))
        gates = sorted({c.only_with for c in conditions if c.only_with})
        if conditions and all(c.only_with for c in conditions):
            # No condition would be watched on a stack without any of them: never reached.
            out.append(Need(path, "|".join(gates), f"{who} (every condition is only_with)", when=gate,
                            unless=unless))
    for name in scenario.checks.enabled():
        spec = check_registry.get(name)
        for cap in sorted(spec.capability_needs(getattr(scenario.checks, name))):
            out.append(Need(("checks", name), cap, f"check {name}"))
    for var in scenario.variables:
        out.append(Need(("variables", var), variable_need(var), f"variable {var}"))
    engine = scenario.engine
    if engine.bugs:
        out.append(Need(("engine", "bugs"), "engine.planted_bugs", "engine.bugs"))
    for option, var in engine.option_variables().items():
        out.append(Need(("engine", option), variable_need(var), f"engine.{option}"))
    tenants = scenario.workload.tenants
    if (len(tenants) if isinstance(tenants, list) else tenants) > 1:
        out.append(Need(("workload", "tenants"), "engine.cache_salt", "workload.tenants > 1"))
    return out


#: Name prefix of the reference engine's own counters (chaos/engine/metrics.py; docs/reach.md).
KVCHAOS_ENGINE_METRICS = "kvchaos_engine_"


def trigger_needs(cond) -> list[str]:
    """What one trigger condition (chaos.probes.Condition) needs from the stack: the engine's
    /metrics for a metric of the engine, the reference engine's ``kvchaos_engine_*`` counters
    (no other engine has them: on vLLM the trigger could never be reached, so the run would
    end inconclusive), its /debug/state for a JSON probe of it, LMCache's HTTP API for a
    relative URL of LMCache."""
    out: list[str] = []
    relative = cond.probe != "log" and (cond.url is None or cond.url.startswith("/"))
    if cond.service == "engine" and cond.probe == "metric":
        out.append("engine.metrics")
        if any(n.startswith(KVCHAOS_ENGINE_METRICS) for n in cond.metric_names):
            out.append("engine.kvchaos_metrics")
    if cond.service == "engine" and cond.probe == "json" and relative and (cond.url or "").startswith("/debug/"):
        out.append("engine.debug_state")
    if cond.service == "lmcache" and relative:
        out.append("lmcache.http")
    return out


def need_met(capability: str, have: set[str]) -> bool:
    """True when ``have`` holds the capability (or one alternative of ``"a|b"``)."""
    return any(alt in have for alt in capability.split("|"))


def missing(needs: list[Need], have: set[str]) -> list[Need]:
    """The needs ``have`` does not meet, in order (a need ``when`` X counts only where ``have``
    holds X, every one of ``X&Y``; a need ``unless`` X only where it does not)."""
    return [n for n in needs if (n.when is None or all(w in have for w in n.when.split("&")))
            and (n.unless is None or n.unless not in have) and not need_met(n.capability, have)]


def explain(need: Need) -> str:
    """``fault 'x' (hook) needs engine.hooks.stall (POST ...; listed under ...)``."""
    alts = need.capability.split("|")
    if len(alts) == 1:
        return f"{need.who} needs {describe(alts[0])}"
    return f"{need.who} needs one of: " + "; ".join(describe(a) for a in alts)
