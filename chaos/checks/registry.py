"""The check registry: YAML key under `checks:` -> checker function and its config model.

Each check module registers itself on import (`@register("leaks", LeaksConfig)`); the name in
the YAML, the registry, result.json, junit.xml and the HTML report is the same string.

What a check needs from the stack is a registry field, declared the same way as a fault kind's
(chaos/faults/base.py): `@register("hit_recovery", HitRecoveryConfig,
needs=("engine.cache_stats",))` with capability names from chaos/stack/capabilities.py ("a|b":
either), and `needs_for=fn(config) -> set[str]` when they depend on the check's settings
(recompute_equivalence's tolerant mode needs logprobs). A scenario whose stack lacks one is
rejected before anything starts (chaos.scenario.loader.validate_against_stack).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping, TypeVar

from pydantic import BaseModel

from chaos.checks.result import CheckResult
from chaos.checks.snapshots import Snapshots

CheckFn = Callable[[list[Any], Snapshots, Any], CheckResult]
C = TypeVar("C", bound=BaseModel)


@dataclass(frozen=True)
class CheckSpec:
    """A registered check: its YAML name, function, config model and what it needs."""

    name: str
    fn: CheckFn
    config_model: type[BaseModel]
    doc: str
    needs: tuple[str, ...] = ()
    needs_for: Callable[[Any], Iterable[str]] | None = None

    def capability_needs(self, config: Any = None) -> set[str]:
        """Capabilities the check needs with ``config`` (None: the defaults)."""
        out = set(self.needs)
        if self.needs_for is not None:
            out |= set(self.needs_for(coerce_config(config, self.config_model)))
        return out


_REGISTRY: dict[str, CheckSpec] = {}


def register(name: str, config_model: type[BaseModel], *, needs: Iterable[str] = (),
             needs_for: Callable[[Any], Iterable[str]] | None = None) -> Callable[[CheckFn], CheckFn]:
    """Decorator: register `fn` as the check called `name` (its YAML key).

    Args:
        name: the YAML key under `checks:`.
        config_model: the check's settings model.
        needs: capabilities the check always needs (chaos/stack/capabilities.py).
        needs_for: more needs from the settings, `fn(config) -> names`.

    Raises:
        ValueError: a check with that name is already registered.
        TypeError: `needs` names an unknown capability.
    """
    from chaos.stack.capabilities import is_known

    needs = tuple(needs)
    unknown = [n for need in needs for n in need.split("|") if not is_known(n)]
    if unknown:
        raise TypeError(f"check {name!r} needs unknown capabilities {unknown}; add them to "
                        "chaos/stack/capabilities.py CAPABILITIES")

    def deco(fn: CheckFn) -> CheckFn:
        if name in _REGISTRY and _REGISTRY[name].fn is not fn:
            raise ValueError(f"check {name!r} is registered twice")
        doc = (fn.__doc__ or "").strip().splitlines()
        _REGISTRY[name] = CheckSpec(name, fn, config_model, doc[0] if doc else "", needs, needs_for)
        return fn

    return deco


def names() -> list[str]:
    """Registered check names, sorted."""
    return sorted(_REGISTRY)


def get(name: str) -> CheckSpec:
    """The check registered as `name`.

    Raises:
        KeyError: no such check; the message lists the known names.
    """
    try:
        return _REGISTRY[name]
    except KeyError:
        raise KeyError(f"unknown check {name!r}; known checks: {', '.join(names())}") from None


def coerce_config(config: Any, model: type[C]) -> C:
    """Turn a check's config (None, a dict from YAML, or the scenario's pydantic model) into `model`.

    Raises:
        pydantic.ValidationError: the dict does not fit the model.
    """
    if config is None:
        return model()
    if isinstance(config, model):
        return config
    if isinstance(config, BaseModel):
        config = config.model_dump()
    return model.model_validate(config)


def run_checks(history: Iterable[Any], snapshots: Snapshots,
               checks: Mapping[str, Any]) -> list[CheckResult]:
    """Run the checks a scenario asks for, in the order given.

    Args:
        history: the run's ops (dicts or `Op` models).
        snapshots: the runner's final-state snapshots.
        checks: check name -> its config (dict, pydantic model or None), e.g. the scenario's
            `checks:` mapping.
    Returns:
        one CheckResult per requested check. A check that raises is reported as "unknown" with
        the exception in its summary (a crashing checker cannot decide, it must not pass).
    Raises:
        KeyError: a name is not a registered check.
    """
    ops = list(history)
    out: list[CheckResult] = []
    for name, cfg in checks.items():
        spec = get(name)
        if cfg is None:
            cfg = spec.config_model()
        try:
            out.append(spec.fn(ops, snapshots, cfg))
        except Exception as exc:  # a checker bug must surface as "could not decide"
            out.append(CheckResult(name=name, verdict="unknown",
                                   summary=f"check crashed: {type(exc).__name__}: {exc}",
                                   details={"exception": repr(exc)}))
    return out
