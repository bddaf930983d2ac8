"""Checkers: pure functions of (history, snapshots, config) -> CheckResult.

    history (ops) + Snapshots ──> check ──> CheckResult{name, verdict, summary, details}
                                               └─ combine(results): worst verdict wins

Importing this package registers every shipped check under its YAML name:
recompute_equivalence, leaks, liveness, evidence, isolation, hit_recovery, hit_quality, slo.
"""

from chaos.checks import (  # noqa: F401  (register)
    evidence,
    hit_quality,
    hit_recovery,
    isolation,
    leaks,
    liveness,
    recompute_equivalence,
    slo,
)
from chaos.checks.registry import CheckSpec, get, names, register, run_checks
from chaos.checks.result import CheckResult, Verdict, combine, worst
from chaos.checks.snapshots import LeakError, LeakSample, ServiceExit, Snapshots

__all__ = ["CheckResult", "CheckSpec", "LeakError", "LeakSample", "ServiceExit", "Snapshots", "Verdict",
           "combine", "get", "names", "register", "run_checks", "worst"]
