"""The Scenario model: the contract SREs write (docs/architecture.md section 5).

This module is the source of truth for the scenario file; schemas/scenario.schema.json and
docs/scenarios.md follow from it. Every model forbids unknown keys, so a typo is an error with
its file:line (chaos/scenario/loader.py), never a silently ignored setting.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic_core import PydanticCustomError
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    StrictInt,
    ValidationInfo,
    field_validator,
    model_validator,
)

from chaos.checks.config import ChecksConfig, Within
from chaos.duration import PositiveDuration
from chaos.faults import registry
from chaos.faults.base import FaultParams
from chaos.probes import Triggered, TriggerSpec, reason_field, trigger_field
from chaos.workload.spec import WorkloadSpec

if TYPE_CHECKING:
    from chaos.yamlsource import Locator

__all__ = ["Scenario", "Phase", "EngineOptions", "Xfail", "XfailMark", "FaultSpec", "SLUG_PATTERN", "REFERENCE_ERROR"]

#: pydantic error type of the checks between parts of a scenario (duplicate names, unknown
#: phase references). chaos/scenario/loader.py runs the same checks on the file's data with the
#: line of each name, so it drops these from pydantic's answer.
REFERENCE_ERROR = "scenario_reference"


def _reference_error(message: str) -> PydanticCustomError:
    return PydanticCustomError(REFERENCE_ERROR, "{message}", {"message": message})

SLUG_PATTERN = r"^[a-z0-9][a-z0-9-]*$"

registry.load_builtin_faults()
FaultSpec = registry.fault_union()
"""The discriminated union (on ``kind``) of every registered fault's params model."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class EngineOptions(_Strict):
    """How the runner starts the engine under test (the reference engine)."""

    bugs: list[str] = Field(
        default_factory=list,
        description="planted bug switches (--bug NAME) of the reference engine; [] = the clean engine",
    )
    prefix_caching: bool = Field(
        default=False,
        description="the engine's own local prefix cache (vLLM's APC) on; off by default so that "
        "prefix hits come from LMCache",
    )
    numerics: Literal["exact", "batch-dependent"] = Field(
        default="exact",
        description="reference engine and its twin: exact (bit-exact, the default) or batch-dependent "
        "(results depend on the batch, as non-batch-invariant GPU kernels do; for "
        "recompute_equivalence's tolerant mode)",
    )

    def stack_variables(self) -> dict[str, str]:
        """Variables the stack file reads to start the engine this way
        (``KVCHAOS_ENGINE_BUGS``, ``KVCHAOS_ENGINE_PREFIX_CACHING``, ``KVCHAOS_ENGINE_NUMERICS``)."""
        return {
            "KVCHAOS_ENGINE_BUGS": ",".join(sorted(self.bugs)),
            "KVCHAOS_ENGINE_PREFIX_CACHING": "--enable-prefix-caching" if self.prefix_caching
            else "--no-enable-prefix-caching",
            "KVCHAOS_ENGINE_NUMERICS": self.numerics,
        }

    def option_variables(self) -> dict[str, str]:
        """``{option: variable}`` for each option set away from its default: the stack file must
        read that variable, or the option would silently not reach the engine."""
        out = {}
        if self.prefix_caching:
            out["prefix_caching"] = "KVCHAOS_ENGINE_PREFIX_CACHING"
        if self.numerics != "exact":
            out["numerics"] = "KVCHAOS_ENGINE_NUMERICS"
        return out


class XfailMark(_Strict):
    """A log line that shows a known bug's mechanism (e.g. LMCache's "free_lookup_locks ... while
    its prefetch is still running"): ``kvchaos explore`` reports a failure as this known bug when
    its run logged every mark, whatever other faults reached it (chaos/explore/signature.py)."""

    log: str = Field(min_length=1, description="a regular expression (Python re) matched against each line "
                     "the service logged during the run")
    service: str = Field(min_length=1, description="the service: a stack role (engine, lmcache, redis, ...) "
                         "or a compose service name")

    @field_validator("log")
    @classmethod
    def _compiles(cls, v: str) -> str:
        import re

        try:
            re.compile(v)
        except re.error as exc:
            raise ValueError(f"not a regular expression: {exc}") from None
        return v


class Xfail(_Strict):
    """The scenario is expected to fail: a known, reported bug. A pass is reported as XPASS.
    With ``stacks``, only on those stack files (a bug of one engine: elsewhere the scenario must
    pass); with ``checks``, only when no other check fails (another failed check: FAILED)."""

    reason: str = Field(min_length=1, description="why it is expected to fail")
    evidence: str | None = Field(default=None, description="what a failing run shows (e.g. the check and its symptom)")
    upstream: str | None = Field(default=None, description="the upstream report, e.g. 'LMCache issue 2206'")
    stacks: list[str] | None = Field(
        default=None, min_length=1,
        description="expected to fail only on these stacks (stack file names without .yml, e.g. "
                    "vllm-cpu); default: every stack")
    checks: list[str] | None = Field(
        default=None, min_length=1,
        description="the checks the known bug fails; a run where another check fails is FAILED, "
                    "not XFAIL; default: any check")
    marks: list[XfailMark] | None = Field(
        default=None, min_length=1,
        description="log lines that show the bug's mechanism: kvchaos explore reports a failure of one "
                    "of this scenario's checks as this known bug when its run logged every mark and faulted "
                    "each part of the stack this scenario's faults act on (others by the way), and only then; "
                    "default: the same fault kinds make a failure this bug")
    leaks: list[str] | None = Field(
        default=None, min_length=1,
        description="what the known bug leaves held, as leak source.field of the stack file's leak_sources "
                    "(e.g. lmcache.read_locked_count): a run whose leaks check finds another field held is "
                    "FAILED, not XFAIL (an engine block leak beside the known L2 read-lock leak is another "
                    "bug), and kvchaos explore reports a failed leaks check as this known bug only when every "
                    "field that leaked is one of these; default: any leak is the known bug's in kvchaos run, "
                    "none in explore")

    @field_validator("leaks")
    @classmethod
    def _source_dot_field(cls, v: list[str] | None) -> list[str] | None:
        import re

        for item in v or ():
            if not re.fullmatch(r"[A-Za-z0-9_-]+\.[A-Za-z0-9_:.-]+", item):
                raise ValueError(f"{item!r} is not source.field (e.g. lmcache.read_locked_count)")
        return v


class Phase(_Strict, Triggered):
    """A step of the run. The phase lasts until its requests are done, at least until its
    longest fault (``start`` + ``duration``) ends, and at least ``duration`` if given; then
    faults with ``until: end`` are healed and the next phase starts."""

    name: str = Field(pattern=SLUG_PATTERN, description="phase name, unique in the scenario: [a-z0-9-]+")
    requests: StrictInt | None = Field(
        default=None,
        ge=0,
        description="requests in this phase; default workload.requests; 0 = no workload in this phase",
    )
    duration: PositiveDuration | None = Field(
        default=None, description="minimum length of the phase (e.g. 30s); default: as long as its requests and faults"
    )
    faults: list[FaultSpec] = Field(  # type: ignore[valid-type]
        default_factory=list, description="faults applied during this phase, each on its own timeline"
    )
    trigger: TriggerSpec = trigger_field(
        "what must be seen while the phase runs for the scenario to count (one condition "
        "or a list; as a fault's trigger); not seen: the run is inconclusive. `none` (with `reason`): "
        "nothing proves the phase's window, and a run whose checks pass is 'passed (window not proven)'")
    reason: str | None = reason_field(
        "with `trigger: none`: why nothing can prove this phase's window (required there, "
        "not allowed otherwise)")
    requests_start: Literal["after_faults", "at_once"] = Field(
        default="after_faults",
        description="after_faults: the phase's requests start once its faults with start 0 are "
        "applied; at_once: together with them (the requests race the fault)",
    )
    ends_within: Within | None = Field(
        default=None,
        description="a timing premise: this phase (its requests, faults and duration) ends at most `s` seconds "
        "after the start of `phase` (this phase or an earlier one; default this phase); later, the run is "
        "inconclusive (e.g. a lookup that should renew a lock came after its TTL could expire)",
    )


class Scenario(_Strict):
    """One chaos scenario: a stack, a workload, phases with faults, and checks."""

    model_config = ConfigDict(extra="forbid", title="kvchaos scenario")

    name: str = Field(pattern=SLUG_PATTERN, max_length=100, description="scenario name: [a-z0-9-]+")
    description: str = Field(default="", description="what production failure this models")
    stack: Path = Field(description="stack file (compose format), relative to the scenario file")
    seed: StrictInt = Field(default=0, description="seed of the workload and of every random choice of the run")
    engine: EngineOptions = Field(default_factory=EngineOptions, description="engine options")
    xfail: Xfail | None = Field(default=None, description="expected failure (a known bug)")
    workload: WorkloadSpec = Field(default_factory=WorkloadSpec, description="the requests to send")
    variables: dict[str, str] = Field(
        default_factory=dict,
        description="stack variables for this scenario (e.g. LMCACHE_L1_SIZE_GB: '0.05'); the services "
        "whose command or environment they change are restarted with them; *_PORT variables are "
        "not allowed (ports are allocated by the stack)",
    )
    phases: list[Phase] = Field(min_length=1, description="the phases, run in order")
    checks: ChecksConfig = Field(description="the checks to run; a check omitted is not run")

    _source: Path | None = PrivateAttr(default=None)
    _locator: Locator | None = PrivateAttr(default=None)

    @field_validator("stack")
    @classmethod
    def _stack_exists(cls, v: Path, info: ValidationInfo) -> Path:
        ctx = info.context or {}
        source = ctx.get("source")
        base = Path(source).parent if source is not None else Path.cwd()
        resolved = v if v.is_absolute() else base / v
        if ctx.get("check_paths", True):
            from chaos.yamlsource import display_path, path_problem

            problem = path_problem(resolved)
            if problem is not None:
                raise ValueError(f"stack file {display_path(resolved)}: {problem}"
                                 + (" (relative to the scenario file)" if not v.is_absolute() else ""))
        return resolved

    @field_validator("checks", mode="before")
    @classmethod
    def _checks_null(cls, v: Any) -> Any:
        return {} if v is None else v  # `checks:` with nothing: say which checks exist

    @field_validator("phases")
    @classmethod
    def _names(cls, phases: list[Phase]) -> list[Phase]:
        seen_phases: set[str] = set()
        for phase in phases:
            if phase.name in seen_phases:
                raise _reference_error(f"phase name {phase.name!r} is used twice")
            seen_phases.add(phase.name)
        index = 0
        seen: dict[str, str] = {}
        for phase in phases:
            for fault in phase.faults:
                if fault.name is None:
                    fault.name = f"{fault.kind}-{index}"
                if fault.name in seen:
                    raise _reference_error(
                        f"fault name {fault.name!r} is used twice (phases {seen[fault.name]!r} "
                        f"and {phase.name!r}); give each fault a distinct `name`"
                    )
                seen[fault.name] = phase.name
                index += 1
        return phases

    @model_validator(mode="after")
    def _triggers_need_evidence(self) -> Scenario:
        has = [p.name for p in self.phases if p.conditions or any(f.conditions for f in p.faults)]
        if has and self.checks.evidence is None:
            raise ValueError(f"phase(s) {has} declare a `trigger`, which the `evidence` check evaluates: "
                             "add `evidence: {}` under `checks`")
        timed = [p.name for p in self.phases if p.ends_within is not None]
        if timed and self.checks.evidence is None:
            raise ValueError(f"phase(s) {timed} declare `ends_within`, which the `evidence` check evaluates: "
                             "add `evidence: {}` under `checks`")
        return self

    @model_validator(mode="after")
    def _check_phase_names(self) -> Scenario:
        names = [p.name for p in self.phases]
        for i, phase in enumerate(self.phases):
            ref = phase.ends_within.phase if phase.ends_within is not None else None
            if ref is not None and ref not in names[: i + 1]:
                raise _reference_error(f"phase {phase.name!r}: ends_within.phase {ref!r} is not this phase or "
                                       f"an earlier one; the phases up to it: {names[: i + 1]}")
        leaks = self.checks.leaks
        if leaks is not None and leaks.back_within is not None and leaks.back_within.phase is not None:
            if leaks.back_within.phase not in names:
                raise _reference_error(f"checks.leaks.back_within names unknown phase "
                                       f"{leaks.back_within.phase!r}; the scenario has {names}")
        hr = self.checks.hit_recovery
        if hr is not None:
            names = [p.name for p in self.phases]
            unknown = [n for n in hr.phases if n not in names]
            if unknown:
                raise _reference_error(f"checks.hit_recovery.phases names unknown phase(s) {unknown}; "
                                       f"the scenario has {names}")
        for check in ("hit_quality", "slo"):
            cfg = getattr(self.checks, check)
            if cfg is not None:
                names = [p.name for p in self.phases]
                unknown = [n for n in cfg.phase_refs() if n not in names]
                if unknown:
                    raise _reference_error(f"checks.{check} names unknown phase(s) {unknown}; "
                                           f"the scenario has {names}")
        return self

    @field_validator("variables")
    @classmethod
    def _variable_names(cls, v: dict[str, str]) -> dict[str, str]:
        import re

        for name in v:
            if not re.fullmatch(r"[A-Z_][A-Z0-9_]*", name):
                raise ValueError(f"variable name {name!r} must be UPPER_CASE letters, digits and _")
            if name.endswith("_PORT"):
                raise ValueError(f"{name}: ports are chosen by the stack; a scenario cannot set them")
            if name.startswith("KVCHAOS_ENGINE_"):
                raise ValueError(f"{name}: set engine options under `engine:` instead")
        return v

    def stack_variables(self) -> dict[str, str]:
        """Every stack variable this scenario sets: ``variables`` plus the engine options."""
        return {**self.variables, **self.engine.stack_variables()}

    @property
    def expected_failure(self) -> Xfail | None:
        """``xfail`` where it applies to the stack this scenario runs on (``xfail.stacks`` names
        stack files by stem; ``kvchaos run --stack`` replaces ``stack``), else None."""
        x = self.xfail
        if x is None or x.stacks is None or Path(self.stack).stem in x.stacks:
            return x
        return None

    @property
    def source(self) -> Path | None:
        """The scenario file this was loaded from (None when built in Python)."""
        return self._source

    @property
    def locator(self) -> Locator | None:
        """Line numbers of the scenario file's keys (see chaos.yamlsource.Locator)."""
        return self._locator

    def faults(self) -> list[tuple[int, int, FaultParams]]:
        """Every fault as (phase index, fault index within the phase, params), in file order."""
        return [(p, f, fault) for p, phase in enumerate(self.phases) for f, fault in enumerate(phase.faults)]

    def phase_requests(self, phase: Phase) -> int:
        """Requests the phase sends: its own ``requests`` or the workload's."""
        return self.workload.requests if phase.requests is None else phase.requests

    @classmethod
    def json_schema(cls) -> dict[str, Any]:
        """The JSON Schema (draft 2020-12) of the scenario file, for editors and the docs."""
        schema = cls.model_json_schema(mode="validation")
        return {
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            **schema,
        }
