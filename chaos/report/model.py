"""The report's data: result.json (one run) and suite.json (several runs).

result.json is the source of truth of a run's outcome; junit.xml and report.html are rendered
from it (plus history.jsonl for the timeline), so `kvchaos report DIR` can re-render them.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from chaos.checks.result import CheckResult
from chaos.checks.snapshots import ServiceExit
from chaos.stats import RunStats

SCHEMA_VERSION = 1

#: A run whose checks all passed while a window of it was not proven (a fault or phase that
#: says ``trigger: none``): never plain "passed".
UNPROVEN = "passed (window not proven)"

RunVerdict = Literal["passed", "failed", "unknown", "interrupted", "passed (window not proven)"]
"""A run's verdict: the checks' (chaos.checks.result.Verdict), "passed (window not proven)"
(:data:`UNPROVEN`) when they passed but a window was not proven, or "interrupted" when SIGINT
or SIGTERM stopped it before its checks gave one."""

#: Rank of run verdicts, worse higher (a suite's verdict is its worst run's).
RUN_RANK: dict[str, int] = {"passed": 0, UNPROVEN: 1, "unknown": 2, "failed": 3, "interrupted": 4}

# Exit codes of `kvchaos run` (DESIGN.md).
EXIT_PASSED = 0
EXIT_FAILED = 1
EXIT_INVALID = 2
EXIT_INFRA = 3
EXIT_INCONCLUSIVE = 4
#: Every check passed but a window was not proven (``trigger: none``): not 0, so that a CI that
#: only asks "did it pass?" is not told yes; not 4, since the author said so on purpose.
EXIT_UNPROVEN = 5


class XfailInfo(BaseModel):
    """A scenario expected to fail (a known upstream bug).

    outcome: "xfailed" when a check failed as expected, "xpassed" when all passed (the bug may be
    fixed), None when the run was inconclusive.
    """

    reason: str
    evidence: str | None = None
    upstream: str | None = None
    checks: list[str] | None = None
    #: the leak fields (``source.field``) the known bug leaves held; None: not declared.
    leaks: list[str] | None = None
    outcome: Literal["xfailed", "xpassed"] | None = None
    #: failed checks that ``checks`` does not name, and ``leaks (source.field, ...)`` for leak
    #: fields ``leaks`` does not name: the run is FAILED, not XFAIL.
    unexpected: list[str] = Field(default_factory=list)


class InterruptInfo(BaseModel):
    """A run (or suite) stopped by SIGINT or SIGTERM (chaos/interrupts.py).

    signal: its name ("SIGTERM"); exit_code: 128 + its number (130 SIGINT, 143 SIGTERM);
    stage: what the run did when it came ("stack start-up", "phase warm", "quiesce",
    "recompute oracle", "checks", "report", "teardown"); phases_run: the phases that started;
    healed / not_healed: fault ids applied and healed on the way out / whose heal failed.
    """

    signal: str
    exit_code: int
    stage: str | None = None
    phases_run: list[str] = Field(default_factory=list)
    healed: list[str] = Field(default_factory=list)
    not_healed: list[str] = Field(default_factory=list)

    def describe(self) -> str:
        """``"SIGTERM during phase warm; healed: slow-link"``."""
        out = self.signal + (f" during {self.stage}" if self.stage else "")
        if self.healed:
            out += f"; healed: {', '.join(self.healed)}"
        if self.not_healed:
            out += f"; NOT healed: {', '.join(self.not_healed)}"
        return out


class FaultSummary(BaseModel):
    """A fault as applied in the run: times in s since run start, evidence from heal."""

    fault_id: str
    kind: str = ""
    phase: str = ""
    applied_at: float | None = None
    healed_at: float | None = None
    params: dict[str, Any] = Field(default_factory=dict)
    evidence: dict[str, Any] | None = None
    bit: bool = False
    #: What the fault's trigger saw ({"reached", "conditions", ...}); None without a trigger.
    trigger: dict[str, Any] | None = None
    error: str | None = None


class PhaseSpan(BaseModel):
    """A phase of the run: first and last op time seen in it (s since run start)."""

    name: str
    start: float
    end: float


class Durations(BaseModel):
    """Wall-clock seconds spent per runner stage (None: not measured)."""

    total_s: float | None = None
    stack_up_s: float | None = None
    workload_s: float | None = None
    quiesce_s: float | None = None
    checks_s: float | None = None
    stack_down_s: float | None = None


class RunPaths(BaseModel):
    """Files of a run, relative to the run directory."""

    result: str = "result.json"
    history: str = "history.jsonl"
    junit: str = "junit.xml"
    html: str = "report.html"
    logs: str = "logs"


class RunResult(BaseModel):
    """result.json: everything about one scenario run.

    verdict is the composition of the checks (worst wins), "unknown" when the run hit an
    infrastructure error, or "interrupted" when a signal stopped it (``interrupted`` says
    which, when and what was healed); exit_code follows DESIGN.md (0 passed, 1 failed, 3 infra,
    4 inconclusive; an xfail scenario whose check failed as expected exits 0; 130/143 when
    interrupted by SIGINT/SIGTERM).
    """

    schema_version: int = SCHEMA_VERSION
    run_id: str
    scenario: str
    description: str = ""
    scenario_path: str | None = None
    stack: str | None = None
    #: The fault proxy that served the run (chaos/stack/base.py ``Stack.proxy_info``): impl
    #: bundled / real / external, its version, binary or image, API address.
    proxy: dict[str, str] | None = None
    seed: int | None = None
    started_at: str | None = None
    verdict: RunVerdict
    exit_code: int
    checks: list[CheckResult] = Field(default_factory=list)
    stats: RunStats = Field(default_factory=RunStats)
    faults: list[FaultSummary] = Field(default_factory=list)
    phases: list[PhaseSpan] = Field(default_factory=list)
    service_exits: list[ServiceExit] = Field(default_factory=list)
    durations: Durations = Field(default_factory=Durations)
    paths: RunPaths = Field(default_factory=RunPaths)
    xfail: XfailInfo | None = None
    engine_bugs: list[str] = Field(default_factory=list)
    error: str | None = None
    interrupted: InterruptInfo | None = None


class SuiteEntry(BaseModel):
    """One run of a suite, as listed in suite.json."""

    run_id: str
    scenario: str
    verdict: RunVerdict
    exit_code: int
    xfail: str | None = None
    summary: str = ""
    duration_s: float | None = None
    run_dir: str


class SuiteResult(BaseModel):
    """suite.json: several scenario runs.

    verdict: the worst run's, where a run that failed as its scenario expects (XFAIL, exit 0)
    counts as passed (each entry in ``runs`` keeps its own verdict and ``xfail`` outcome).
    exit_code: the worst run's (1 if any failed, else 3 if any infra error, else 4 if any
    inconclusive, else 5 if any passed with a window not proven, else 0); 130/143 when a signal
    stopped the suite (``interrupted``).
    """

    schema_version: int = SCHEMA_VERSION
    suite_id: str
    verdict: RunVerdict
    exit_code: int
    runs: list[SuiteEntry] = Field(default_factory=list)
    interrupted: InterruptInfo | None = None
