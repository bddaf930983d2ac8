"""Load scenario files: YAML -> Scenario with file:line errors, and checks against a stack.

    scenarios/x.yaml ──load_scenario──> Scenario (faults named, stack path resolved)
                                          │
    stack's links/services ──validate_against_stack──> ConfigError at the fault's line
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from chaos.scenario.model import Scenario
from chaos.yamlsource import ConfigError, format_path, load_model

__all__ = ["load_scenario", "validate_against_stack", "discover_scenarios", "is_stack_file", "SCENARIO_SUFFIXES"]

SCENARIO_SUFFIXES = (".yaml", ".yml")


def load_scenario(path: str | Path, *, check_paths: bool = True) -> Scenario:
    """Read and validate one scenario file.

    Args:
        path: the scenario YAML file.
        check_paths: check that the stack file exists (the default).

    Returns:
        The Scenario, with ``source``/``locator`` set, fault names filled in (``<kind>-<i>``)
        and ``stack`` resolved against the scenario's folder.

    Raises:
        ConfigError: unreadable file, YAML syntax, unknown key, bad value, missing stack file;
            every problem is listed in ``problems`` as ``file:line: field: message``.
    """
    scenario, locator = load_model(path, Scenario, context={"check_paths": check_paths})
    scenario._source = Path(path)
    scenario._locator = locator
    return scenario


def validate_against_stack(
    scenario: Scenario, links: Iterable[str], services: Iterable[str] | None = None,
    settings: Any = None,
) -> None:
    """Check every name a fault refers to exists in the stack.

    Args:
        scenario: a loaded scenario (its locator gives the lines; built in Python: no line).
        links: names of the stack's links (x-kvchaos.links).
        services: names of the stack's services; None skips service references.
        settings: the stack's x-kvchaos settings; when given, the services and URLs of every
            trigger (of faults and phases) are checked too (chaos/probes.py).

    Raises:
        ConfigError: one per unknown name found, all listed in ``problems``; the first
            describes file/line/field, e.g. ``x.yaml:14: phases[1].faults[0].link: unknown link
            'engine-lmcach'; the stack has: engine-lmcache, lmcache-redis``.
    """
    known = {"link": set(links), "service": set(services) if services is not None else None}
    file = str(scenario.source) if scenario.source is not None else f"<scenario {scenario.name}>"
    errors: list[ConfigError] = []
    for p, f, fault in scenario.faults():
        for ref_kind, name in fault.stack_refs().items():
            names = known.get(ref_kind)
            if names is None or name in names:
                continue
            path = ("phases", p, "faults", f, ref_kind)
            line = scenario.locator.line_of(path) if scenario.locator is not None else None
            have = ", ".join(sorted(names)) or "none"
            errors.append(
                ConfigError(
                    file, line, format_path(path), f"unknown {ref_kind} {name!r}; the stack has: {have}"
                )
            )
    if settings is not None:
        from chaos.probes import trigger_problems

        svc = set(services) if services is not None else None
        owners = [(("phases", p, "faults", f), fault.trigger) for p, f, fault in scenario.faults()]
        owners += [(("phases", p), phase.trigger) for p, phase in enumerate(scenario.phases)]
        for prefix, trigger in owners:
            for sub, message in trigger_problems(trigger, settings, svc):
                path = prefix + ("trigger",) + sub
                line = scenario.locator.line_of(path) if scenario.locator is not None else None
                errors.append(ConfigError(file, line, format_path(path), message))
    if errors:
        first = errors[0]
        raise ConfigError(
            first.file, first.line, first.field, first.message,
            problems=[p for e in errors for p in e.problems],
        )


def discover_scenarios(root: str | Path) -> list[Path]:
    """Scenario files under ``root`` (a file or a folder, searched recursively), sorted.

    Raises:
        ConfigError: ``root`` does not exist.
    """
    root = Path(root)
    if root.is_file():
        return [root]
    if not root.is_dir():
        raise ConfigError(str(root), None, None, "no such file or folder")
    return sorted(p for p in root.rglob("*") if p.suffix in SCENARIO_SUFFIXES and p.is_file()
                  and not is_stack_file(p))


def is_stack_file(path: str | Path) -> bool:
    """True for a compose-format stack file (top-level ``services``, no ``phases``), which may
    sit next to scenarios but is not one. Unreadable or invalid YAML counts as a scenario, so
    that its error is reported where it belongs."""
    import yaml

    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return False
    return isinstance(data, dict) and "services" in data and "phases" not in data
