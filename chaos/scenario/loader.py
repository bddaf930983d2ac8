"""Load scenario files: YAML -> Scenario with file:line errors, and checks against a stack.

    scenarios/x.yaml ──load_scenario──> Scenario (faults named, stack path resolved)
                        │   path, YAML (bounded), "is it a scenario", schema, names between
                        │   parts (duplicate phase/fault names, unknown phase references),
                        │   the stack file's path: every problem of the file in one pass
                        ▼
                     check_scenario ──> + the stack file loaded: names faults use (links,
                                        services), what checks need (engine_url, recompute_url),
                                        what its faults, checks, variables and engine options need
                                        (stack capabilities, chaos/scenario/needs.py); warnings
                                        (a hook without evidence, file name != name)

Every problem carries the line of the key or item it is about. A file named by ``stack:`` is
read with :func:`chaos.yamlsource.foreign_file`: its errors never quote its text, since the path
may name any file on the host.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pydantic

from chaos.scenario.model import REFERENCE_ERROR, Scenario
from chaos.yamlsource import (ConfigError, Locator, combine_problems, display_path, foreign_file, format_path,
                              kind_of, load_yaml, path_problem, validation_problems)

__all__ = ["load_scenario", "check_scenario", "ScenarioCheck", "validate_against_stack", "discover_scenarios",
           "is_stack_file", "override", "SCENARIO_SUFFIXES", "MAX_DISCOVERED_ENTRIES"]

SCENARIO_SUFFIXES = (".yaml", ".yml")
#: Most folder entries :func:`discover_scenarios` looks at under one root (so `validate /`
#: answers at once instead of walking the disk).
MAX_DISCOVERED_ENTRIES = 20_000
#: Top-level keys that make a mapping a scenario (one of them suffices to try).
_SCENARIO_KEYS = {"name", "stack", "phases", "checks", "workload"}


@dataclass
class ScenarioCheck:
    """Everything :func:`check_scenario` found in one scenario file.

    Attributes:
        file: the file as given (display form).
        scenario: the Scenario when the file itself is valid (the stack may still be at fault).
        problems: every error, one ConfigError each (the scenario's own, by line, then the stack
            file's).
        warnings: things that do not stop a run but likely are mistakes, same form.
    """

    file: str
    scenario: Scenario | None = None
    problems: list[ConfigError] = field(default_factory=list)
    warnings: list[ConfigError] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def error(self) -> ConfigError:
        """All problems as one ConfigError (raise it); only when not :attr:`ok`."""
        return combine_problems(self.problems)

    def warning_lines(self) -> list[str]:
        """``file:line: field: message`` per warning."""
        return [line for w in self.warnings for line in w.problems]


def _line(locator: Locator | None, path: tuple) -> int | None:
    return locator.line_of(path) if locator is not None else None


def _problem(file: str, locator: Locator | None, path: tuple, message: str) -> ConfigError:
    return ConfigError(file, _line(locator, path), format_path(path) or None, message)


def _sorted(problems: list[ConfigError], file: str) -> list[ConfigError]:
    """The file's own problems by line (whole-file ones first), then other files' in order."""
    own = [p for p in problems if p.file == file]
    other = [p for p in problems if p.file != file]
    own.sort(key=lambda p: (p.line or 0, p.column or 0))
    return own + other


def _reference_problems(file: str, data: dict, locator: Locator) -> list[ConfigError]:
    """Names between the parts of a scenario, checked on the file's data so that each problem
    has the line of the name (the model's validators say the same at the list's line)."""
    out: list[ConfigError] = []
    phases = data.get("phases")
    phase_at: dict[str, int] = {}
    fault_at: dict[str, tuple[int, int]] = {}
    if isinstance(phases, list):
        index = 0
        for i, phase in enumerate(phases):
            if not isinstance(phase, dict):
                continue
            name = phase.get("name")
            if isinstance(name, str):
                if name in phase_at:
                    out.append(_problem(file, locator, ("phases", i, "name"),
                                        f"phase name {name!r} is used twice (first at line "
                                        f"{_line(locator, ('phases', phase_at[name], 'name'))})"))
                else:
                    phase_at[name] = i
            within = phase.get("ends_within")
            ref = within.get("phase") if isinstance(within, dict) else None
            if isinstance(ref, str) and ref not in phase_at:
                out.append(_problem(file, locator, ("phases", i, "ends_within", "phase"),
                                    f"ends_within.phase {ref!r} is not this phase or an earlier one; "
                                    f"the phases up to here: {', '.join(phase_at) or 'none'}"))
            faults = phase.get("faults")
            for j, fault in enumerate(faults if isinstance(faults, list) else []):
                fname = fault.get("name") if isinstance(fault, dict) else None
                if fname is None and isinstance(fault, dict) and isinstance(fault.get("kind"), str):
                    fname = f"{fault['kind']}-{index}"  # the model's default name
                index += 1
                if not isinstance(fname, str):
                    continue
                if fname in fault_at:
                    p0, f0 = fault_at[fname]
                    where = ("phases", i, "faults", j) + (("name",) if "name" in fault else ())
                    out.append(_problem(file, locator, where,
                                        f"fault name {fname!r} is used twice (first at line "
                                        f"{_line(locator, ('phases', p0, 'faults', f0))}); give each "
                                        "fault a distinct `name`"))
                else:
                    fault_at[fname] = (i, j)
    checks = data.get("checks")
    if isinstance(phases, list) and isinstance(checks, dict):
        known = ", ".join(phase_at) or "none"
        for check, cfg in checks.items():
            for path, ref in _phase_refs(cfg, ("checks", check)):
                if ref not in phase_at:
                    out.append(_problem(file, locator, path,
                                        f"unknown phase {ref!r}; the scenario's phases: {known}"))
        liveness = checks.get("liveness")
        rules = liveness.get("allowed_failures") if isinstance(liveness, dict) else None
        for i, rule in enumerate(rules if isinstance(rules, list) else []):
            ref = rule.get("fault") if isinstance(rule, dict) else None
            if isinstance(ref, str) and ref not in fault_at:
                out.append(_problem(file, locator, ("checks", "liveness", "allowed_failures", i, "fault"),
                                    f"unknown fault {ref!r}; the scenario's faults: "
                                    f"{', '.join(fault_at) or 'none'}"))
    return out


def _phase_refs(node: Any, path: tuple) -> Iterable[tuple[tuple, str]]:
    """(data path, name) of every phase name under ``node``: a ``phases`` (or ``*_phases``, e.g.
    ``stored_phases``) list of strings or a ``phase`` string, at any depth of a check's settings."""
    if isinstance(node, dict):
        for k, v in node.items():
            if (k == "phases" or (isinstance(k, str) and k.endswith("_phases"))) and isinstance(v, list):
                yield from ((path + (k, i), x) for i, x in enumerate(v) if isinstance(x, str))
            elif k == "phase" and isinstance(v, str):
                yield path + (k,), v
            else:
                yield from _phase_refs(v, path + (k,))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _phase_refs(v, path + (i,))


def _stack_path(source: Path, data: dict) -> Path | None:
    raw = data.get("stack")
    if not isinstance(raw, str) or not raw:
        return None
    p = Path(raw)
    return p if p.is_absolute() else source.parent / p


def _analyse(path: str | Path, *, check_paths: bool, stack_override: Path | None = None
             ) -> tuple[ScenarioCheck, dict | None, Locator | None]:
    """The scenario file alone: path, YAML, shape, schema, references, the stack file's path."""
    file = display_path(path)
    check = ScenarioCheck(file)
    try:
        data, locator = load_yaml(path, display=file)
    except ConfigError as exc:
        check.problems.append(exc)
        return check, None, None
    if not isinstance(data, dict):
        check.problems.append(ConfigError(file, locator.line_of(()), None,
                                          "not a scenario file: expected a mapping with name, stack, "
                                          f"phases and checks, found {kind_of(data)}"))
        return check, None, locator
    if not (set(k for k in data if isinstance(k, str)) & _SCENARIO_KEYS):
        what = "a stack file (it has `services:`); validate the scenarios that name it" \
            if "services" in data else "a mapping with none of name, stack, phases, checks"
        check.problems.append(ConfigError(file, locator.line_of(()), None, f"not a scenario file: found {what}"))
        return check, data, locator
    problems: list[ConfigError] = []
    scenario: Scenario | None = None
    refs = _reference_problems(file, data, locator)
    try:
        scenario = Scenario.model_validate(data, context={"source": Path(path), "locator": locator,
                                                          "check_paths": False})
    except pydantic.ValidationError as exc:
        # The reference checks above say what the model's reference errors say, with each
        # name's line; the model's stay when those checks found nothing (never lose one).
        problems += validation_problems(file, exc, locator, data,
                                        skip_types=(REFERENCE_ERROR,) if refs else ())
    except RecursionError:  # bounded by the loader; kept as a last guard
        problems.append(ConfigError(file, None, None, "document nested too deeply"))
    problems += refs
    if check_paths and stack_override is None:
        stack = _stack_path(Path(path), data)
        if stack is not None:
            problem = path_problem(stack)
            if problem is not None:
                rel = "" if Path(data["stack"]).is_absolute() else " (relative to the scenario file)"
                problems.append(_problem(file, locator, ("stack",),
                                         f"stack file {display_path(stack)}: {problem}{rel}"))
    if scenario is not None:
        scenario._source = Path(path)
        scenario._locator = locator
    check.scenario = scenario if not problems else None
    check.problems = _sorted(problems, file)
    return check, data, locator


def load_scenario(path: str | Path, *, check_paths: bool = True) -> Scenario:
    """Read and validate one scenario file.

    Args:
        path: the scenario YAML file.
        check_paths: check that the stack file can be read (the default).

    Returns:
        The Scenario, with ``source``/``locator`` set, fault names filled in (``<kind>-<i>``)
        and ``stack`` resolved against the scenario's folder.

    Raises:
        ConfigError: unusable path, YAML syntax or bounds, not a scenario, unknown key, bad
            value, a duplicate or unknown name, an unreadable stack file; every problem is
            listed in ``problems`` as ``file:line: field: message``, each at its own line.
    """
    check, _data, _loc = _analyse(path, check_paths=check_paths)
    if check.problems:
        raise check.error()
    assert check.scenario is not None
    return check.scenario


def override(scenario: Scenario, *, bugs: list[str] | None = None, numerics: str | None = None,
             equivalence: str | None = None) -> Scenario:
    """Apply a suite's or the zoo's overrides to a loaded scenario (in place; None keeps the
    scenario's own): planted ``bugs``, engine ``numerics``, ``recompute_equivalence.mode``
    (only where the scenario runs that check).

    Raises:
        pydantic.ValidationError: an invalid numerics or mode value.
    """
    if bugs is not None:
        scenario.engine.bugs = list(bugs)
    if numerics is not None:
        scenario.engine.numerics = type(scenario.engine).model_validate(
            {**scenario.engine.model_dump(), "numerics": numerics}).numerics
    eq = scenario.checks.recompute_equivalence
    if equivalence is not None and eq is not None:
        scenario.checks.recompute_equivalence = type(eq).model_validate({**eq.model_dump(), "mode": equivalence})
    return scenario


def check_scenario(path: str | Path, *, stack: Path | None = None, require_commands: bool = False,
                   overrides: dict[str, Any] | None = None) -> ScenarioCheck:
    """Every problem of a scenario file and of the stack it runs on, in one pass.

    Args:
        path: the scenario file.
        stack: run it on this stack file instead of its own (``--stack``).
        require_commands: every stack service needs a ``command`` (the local backend).
        overrides: a suite's overrides (``bugs``, ``numerics``, ``equivalence``:
            chaos.runner.suite.override), applied before the stack checks so that what they
            need is checked too.

    Returns:
        A :class:`ScenarioCheck` (never raises for bad input): the scenario's own problems (YAML,
        schema, names, stack path), the stack file's, the names its faults use that the stack
        lacks, what its checks need that the stack does not name, the capabilities it needs that
        the stack does not offer, and warnings.
    """
    check, data, locator = _analyse(path, check_paths=True, stack_override=stack)
    if data is None or locator is None or not (set(k for k in data if isinstance(k, str)) & _SCENARIO_KEYS):
        return check
    file = check.file
    check.warnings = _warnings(path, file, data, locator)
    stack_file = Path(stack) if stack is not None else _stack_path(Path(path), data)
    if stack_file is None:
        check.warnings += _window_warnings(file, locator, check.scenario, None)
        return check
    stack_file = stack_file.resolve() if path_problem(stack_file) is None else stack_file
    if stack is not None:
        problem = path_problem(stack_file)
        if problem is not None:
            check.problems.append(ConfigError(display_path(stack_file), None, None, f"{problem} (--stack)"))
            return check
    elif any(p.field == "stack" for p in check.problems):
        return check  # the path is already reported
    from chaos.stack.spec import load_stack  # the stack layer, imported when needed

    try:
        with foreign_file():
            spec = load_stack(stack_file, allocate_ports=False, require_commands=require_commands,
                              run_dir=Path("/nonexistent"))
    except ConfigError as exc:
        if stack is None:
            check.problems.insert(0, _problem(file, locator, ("stack",),
                                              f"the stack file {display_path(stack_file)} is invalid "
                                              "(its problems follow)"))
        check.problems.append(exc)
        check.scenario = None
        return check
    if check.scenario is not None and overrides:
        try:
            override(check.scenario, **overrides)
        except pydantic.ValidationError as exc:
            check.problems.append(ConfigError(file, None, None, f"invalid override: {exc.errors()[0]['msg']}"))
            check.scenario = None
            return check
    problems = _stack_problems(file, data, locator, check.scenario, spec,
                               stack_name=display_path(stack) if stack is not None else None)
    if problems:
        check.problems = _sorted(check.problems + problems, file)
        check.scenario = None
    if check.scenario is not None and stack is not None:
        check.scenario.stack = stack_file
    caps = spec.capabilities()
    off = set() if check.scenario is None else {("phases", p, "faults", f) for p, f, fault in check.scenario.faults()
                                                 if not fault.on_stack(caps)}
    check.warnings += [w for w in _window_warnings(file, locator, check.scenario, caps, skip=off)]
    if check.scenario is not None:
        drop_off_stack_faults(check.scenario, caps)
    return check


def drop_off_stack_faults(scenario: Scenario, capabilities: set[str]) -> list[str]:
    """Leave out (in place) the faults that are not part of the scenario on a stack offering
    ``capabilities`` (a fault's ``only_with`` not offered, or its ``unless_with`` offered), so
    that the runner, the checks and the report see only the faults that run there. Fault
    names are kept (they were given over all faults of the file).

    Returns:
        The ids of the faults left out.
    """
    left_out: list[str] = []
    for phase in scenario.phases:
        keep = [f for f in phase.faults if f.on_stack(capabilities)]
        left_out += [f.id for f in phase.faults if not f.on_stack(capabilities)]
        phase.faults = keep
    return left_out


def _window_warnings(file: str, locator: Locator, scenario: Scenario | None,
                     capabilities: set[str] | None, skip: set[tuple] = frozenset()) -> list[ConfigError]:
    """The faults and phases whose window nothing will prove (chaos/scenario/windows.py), at
    their lines; none for a scenario that did not validate, none for the faults under ``skip``
    (paths of faults that are not part of the scenario on this stack)."""
    if scenario is None:
        return []
    from chaos.scenario.windows import window_warnings

    return [_problem(file, locator, path, message) for path, message in window_warnings(scenario, capabilities)
            if tuple(path[:4]) not in skip]


def _faults(data: dict, scenario: Scenario | None) -> Iterable[tuple[int, int, Any]]:
    """(phase index, fault index, params) for every fault that validates on its own."""
    if scenario is not None:
        yield from scenario.faults()
        return
    from pydantic import TypeAdapter

    from chaos.scenario.model import FaultSpec

    adapter = TypeAdapter(FaultSpec)
    phases = data.get("phases")
    for p, phase in enumerate(phases if isinstance(phases, list) else []):
        faults = phase.get("faults") if isinstance(phase, dict) else None
        for f, raw in enumerate(faults if isinstance(faults, list) else []):
            try:
                yield p, f, adapter.validate_python(raw)
            except (pydantic.ValidationError, ValueError, TypeError):
                continue  # its own problems are reported by the schema pass


def _stack_problems(file: str, data: dict, locator: Locator, scenario: Scenario | None, spec,
                    stack_name: str | None = None) -> list[ConfigError]:
    """Names the faults use that the stack lacks; what the checks need that it does not name;
    the capabilities the scenario needs that the stack does not offer (when it validated)."""
    out: list[ConfigError] = []
    known = {"link": set(spec.settings.links), "service": set(spec.services)}
    for p, f, fault in _faults(data, scenario):
        if not fault.on_stack(spec.capabilities()):
            continue  # not part of the scenario on this stack
        for ref_kind, name in fault.stack_refs().items():
            names = known.get(ref_kind)
            if names is None or name in names:
                continue
            have = ", ".join(sorted(names)) or "none"
            out.append(_problem(file, locator, ("phases", p, "faults", f, ref_kind),
                                f"unknown {ref_kind} {name!r}; the stack has: {have}"))
    key = display_path(spec.path)
    if not spec.settings.engine_url and _sends_requests(data, scenario):
        out.append(_problem(file, locator, ("workload",), f"the scenario sends requests but its stack {key} "
                            "names no x-kvchaos.engine_url"))
    checks = data.get("checks")
    if not spec.settings.recompute_url and isinstance(checks, dict) and "recompute_equivalence" in checks:
        out.append(_problem(file, locator, ("checks", "recompute_equivalence"),
                            f"needs a recompute twin, but the stack {key} names no x-kvchaos.recompute_url"))
    if scenario is not None:
        from chaos.scenario.needs import explain, missing, scenario_needs

        out.extend(_trigger_problems(file, scenario, spec.settings, spec.services, spec.capabilities()))
        out.extend(_xfail_leak_problems(file, locator, scenario, spec))
        where = stack_name or key
        for need in missing(scenario_needs(scenario), spec.capabilities()):
            out.append(_problem(file, locator, need.path, f"{explain(need)}; {where} does not offer it"))
    return out


def _xfail_leak_problems(file: str, locator: Locator, scenario: Scenario, spec) -> list[ConfigError]:
    """``xfail.leaks`` fields of a leak source the run reads (the scenario's own
    ``checks.leaks.sources``, else the stack's) that the source does not read, where the xfail
    applies to this stack: a misspelt field, so that the field it meant would count as a leak
    beyond the known bug's (FAILED, not XFAIL). A field of a source this stack does not have is
    no problem (it cannot leak here: the reference stack's lock ledger on a vLLM stack)."""
    xf = scenario.xfail
    if xf is None or not xf.leaks or (xf.stacks is not None and Path(spec.path).stem not in xf.stacks):
        return []
    cfg = scenario.checks.leaks
    sources = cfg.sources if cfg is not None and cfg.sources is not None else spec.settings.leak_sources
    fields = {src.name: set(src.fields) for src in sources}
    out = []
    for i, item in enumerate(xf.leaks):
        source, _, field = item.partition(".")
        if source in fields and field not in fields[source]:
            out.append(_problem(file, locator, ("xfail", "leaks", i),
                                f"leak source {source!r} reads no field {field!r}; it reads: "
                                f"{', '.join(sorted(fields[source])) or 'none'}"))
    return out


def _sends_requests(data: dict, scenario: Scenario | None) -> bool:
    if scenario is not None:
        return any(scenario.phase_requests(p) for p in scenario.phases)
    from chaos.workload.spec import WorkloadSpec

    workload = data.get("workload")
    default = workload.get("requests") if isinstance(workload, dict) else None
    if not isinstance(default, int):
        default = WorkloadSpec.model_fields["requests"].default
    phases = data.get("phases")
    return any(isinstance(ph, dict) and (ph.get("requests", default) or 0) != 0
               for ph in (phases if isinstance(phases, list) else []))


def _warnings(path: str | Path, file: str, data: dict, locator: Locator) -> list[ConfigError]:
    out: list[ConfigError] = []
    name = data.get("name")
    stem = Path(path).name
    for suffix in SCENARIO_SUFFIXES:
        if stem.endswith(suffix):
            stem = stem[: -len(suffix)]
    if isinstance(name, str) and name != stem:
        out.append(_problem(file, locator, ("name",), f"the file is named {stem!r} but the scenario {name!r}: "
                            "reports, -k and the zoo use the name; rename one"))
    phases = data.get("phases")
    for p, phase in enumerate(phases if isinstance(phases, list) else []):
        faults = phase.get("faults") if isinstance(phase, dict) else None
        for f, fault in enumerate(faults if isinstance(faults, list) else []):
            if isinstance(fault, dict) and fault.get("kind") == "hook" and not fault.get("evidence"):
                out.append(_problem(file, locator, ("phases", p, "faults", f),
                                    "a hook fault without `evidence` cannot show that it bit: the run "
                                    "will be inconclusive (add evidence: {http: ...} or {argv: [...]})"))
    return out


def _trigger_problems(file: str, scenario: Scenario, settings: Any, services: Iterable[str] | None,
                      capabilities: set[str] | None = None) -> list[ConfigError]:
    """The services and URLs every trigger (of faults and phases) names that the stack lacks
    (chaos/probes.py); conditions that do not apply there (``only_with``) and faults that are
    not part of the scenario there (a fault's ``only_with``/``unless_with``) are skipped."""
    from chaos.probes import trigger_problems

    svc = set(services) if services is not None else None
    owners = [(("phases", p, "faults", f), fault.conditions) for p, f, fault in scenario.faults()
              if capabilities is None or fault.on_stack(capabilities)]
    owners += [(("phases", p), phase.conditions) for p, phase in enumerate(scenario.phases)]
    out = []
    for prefix, trigger in owners:
        for sub, message in trigger_problems(trigger, settings, svc, capabilities):
            out.append(_problem(file, scenario.locator, prefix + ("trigger",) + sub, message))
    return out


def validate_against_stack(
    scenario: Scenario, links: Iterable[str], services: Iterable[str] | None = None,
    settings: Any = None, *, capabilities: set[str] | None = None, stack_name: str | None = None,
) -> None:
    """Check every name a fault refers to exists in the stack, and that the stack offers what
    the scenario needs.

    Args:
        scenario: a loaded scenario (its locator gives the lines; built in Python: no line).
        links: names of the stack's links (x-kvchaos.links).
        services: names of the stack's services; None skips service references.
        settings: the stack's x-kvchaos settings; when given, the services and URLs of every
            trigger (of faults and phases) are checked too (chaos/probes.py).
        capabilities: the stack's capabilities (``StackSpec.capabilities()``); None skips the
            capability check.
        stack_name: the stack file, for the capability messages.

    Raises:
        ConfigError: one per unknown name or missing capability, all listed in ``problems``;
            the first describes file/line/field, e.g. ``x.yaml:14: phases[1].faults[0].link:
            unknown link 'engine-lmcach'; the stack has: engine-lmcache, lmcache-redis`` or
            ``x.yaml:27: phases[1].faults[0]: fault 'stall' (hook) needs engine.hooks.stall
            (...); compose/vllm-lmcache.yml does not offer it``.
    """
    known = {"link": set(links), "service": set(services) if services is not None else None}
    file = str(scenario.source) if scenario.source is not None else f"<scenario {scenario.name}>"
    errors: list[ConfigError] = []
    for p, f, fault in scenario.faults():
        for ref_kind, name in fault.stack_refs().items():
            names = known.get(ref_kind)
            if names is None or name in names:
                continue
            have = ", ".join(sorted(names)) or "none"
            errors.append(_problem(file, scenario.locator, ("phases", p, "faults", f, ref_kind),
                                   f"unknown {ref_kind} {name!r}; the stack has: {have}"))
    if capabilities is not None:
        from chaos.scenario.needs import explain, missing, scenario_needs

        where = stack_name or "the stack"
        for need in missing(scenario_needs(scenario), capabilities):
            errors.append(_problem(file, scenario.locator, need.path, f"{explain(need)}; {where} does not offer it"))
    if settings is not None:
        errors.extend(_trigger_problems(file, scenario, settings, services, capabilities))
    if errors:
        raise combine_problems(errors)


def discover_scenarios(root: str | Path) -> list[Path]:
    """Scenario files under ``root`` (a file or a folder, searched recursively without following
    symlinked folders): the folder's
    own files first, then each sub-folder's (``scenarios/*.yaml``, then
    ``scenarios/findings/*.yaml``), each level sorted by path; stack files kept next to scenarios are left out.

    Raises:
        ConfigError: ``root`` cannot be used (see :func:`chaos.yamlsource.path_problem`), or the
            folder holds more than :data:`MAX_DISCOVERED_ENTRIES` entries.
    """
    problem = path_problem(root, want="dir")
    if problem is not None:
        raise ConfigError(display_path(root), None, None, problem)
    root = Path(root)
    if not root.is_dir():
        return [root]
    found: list[Path] = []
    seen = 0
    for folder, dirs, files in os.walk(root, followlinks=False):
        seen += len(dirs) + len(files)
        if seen > MAX_DISCOVERED_ENTRIES:
            raise ConfigError(display_path(root), None, None,
                              f"more than {MAX_DISCOVERED_ENTRIES} files and folders under it; point at "
                              "the folder that holds the scenarios")
        dirs.sort()
        for name in files:
            p = Path(folder) / name
            if p.suffix in SCENARIO_SUFFIXES and os.path.isfile(p):
                found.append(p)
    return sorted((p for p in found if not is_stack_file(p)), key=lambda p: (len(p.relative_to(root).parts), p))


def is_stack_file(path: str | Path) -> bool:
    """True for a compose-format stack file (top-level ``services``, no ``phases``), which may
    sit next to scenarios but is not one. Unreadable or invalid YAML counts as a scenario, so
    that its error is reported where it belongs. Read with the loader's bounds."""
    try:
        data, _ = load_yaml(path)
    except ConfigError:
        return False
    return isinstance(data, dict) and "services" in data and "phases" not in data
