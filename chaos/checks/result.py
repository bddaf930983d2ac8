"""CheckResult: what one checker says about one run, and how verdicts compose.

Jepsen's rule: a checker answers valid? = true | false | unknown, and a composition of checkers
takes the worst answer (failed > unknown > passed). "unknown" is a first-class verdict: a check
that could not decide (nothing completed, a leak source never answered, a fault never bit) must
never read as passed.
"""

from __future__ import annotations

from typing import Any, Iterable, Literal

from pydantic import BaseModel, Field

Verdict = Literal["passed", "failed", "unknown"]

# Worse verdicts rank higher.
_RANK: dict[str, int] = {"passed": 0, "unknown": 1, "failed": 2}


class CheckResult(BaseModel):
    """One checker's answer.

    Attributes:
        name: the check's registry name (= its YAML key under `checks:`).
        verdict: "passed" | "failed" | "unknown".
        summary: one line a person reads first (request id, first differing token, ...).
        details: JSON-serialisable evidence for the report (check-specific shape).
    """

    name: str
    verdict: Verdict
    summary: str
    details: dict[str, Any] = Field(default_factory=dict)


def worst(verdicts: Iterable[Verdict]) -> Verdict:
    """Return the worst of `verdicts` (failed > unknown > passed); "passed" when empty."""
    out: Verdict = "passed"
    for v in verdicts:
        if _RANK[v] > _RANK[out]:
            out = v
    return out


def combine(results: Iterable[CheckResult]) -> Verdict:
    """Compose check results Jepsen-style: the worst verdict wins.

    Args:
        results: the per-check results of one run.
    Returns:
        "failed" if any failed, else "unknown" if any is unknown, else "passed" (also for an
        empty list: no check asked, none failed).
    """
    return worst(r.verdict for r in results)
