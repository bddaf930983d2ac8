"""``kvchaos run``'s call into diagnosis, right after the checks, on the stack the run used.

Bounded: the first ``KVCHAOS_DIAGNOSE`` failing requests (default 3; 0 turns it off), and the
whole diagnosis ends within ``KVCHAOS_DIAGNOSE_BUDGET_S`` seconds (default 60: no request or
step starts after it, every call's timeout is cut to what is left). Failing requests include
hit_quality's. A diagnosis that
fails is recorded in ``diagnosis.json`` (``error``); it never changes the run's verdict.
"""

from __future__ import annotations

import os
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from chaos.checks.result import CheckResult

ENV_LIMIT = "KVCHAOS_DIAGNOSE"
ENV_BUDGET = "KVCHAOS_DIAGNOSE_BUDGET_S"


def options_from_env():
    """The DiagnoseOptions ``kvchaos run`` uses (``KVCHAOS_DIAGNOSE``, ``KVCHAOS_DIAGNOSE_BUDGET_S``).

    Raises:
        ValueError: a variable is not a number.
    """
    from chaos.diagnose.diagnose import DiagnoseOptions

    return DiagnoseOptions(limit=int(os.environ.get(ENV_LIMIT, "3") or 0),
                           budget_s=float(os.environ.get(ENV_BUDGET, "60") or 60))


def diagnose_after_checks(*, run_id: str, scenario: str, stack: Any, run_dir: Path, history: Sequence[Any],
                          expected: dict[str, list[int]], checks: Sequence[CheckResult],
                          say: Callable[[str], None] = lambda _m: None):
    """Diagnose the run's first failing requests and write ``run_dir/diagnosis.json``.

    Returns:
        The Diagnosis, or None when nothing failed a request check or diagnosis is off.
    """
    from chaos.diagnose.diagnose import diagnose_failures, failing_requests, write_diagnosis
    from chaos.diagnose.model import Diagnosis

    try:
        opts = options_from_env()
    except ValueError as exc:
        say(f"diagnosis off: {exc}")
        return None
    if opts.limit <= 0 or not failing_requests(checks, history, stack.settings.chunk_size or 256):
        return None
    say("diagnose")
    try:
        diag = diagnose_failures(history, expected, checks, stack.settings, run_id=run_id, scenario=scenario,
                                 options=opts, say=say)
    except Exception as exc:  # noqa: BLE001 - a diagnosis must never lose the run's report
        diag = Diagnosis(run_id=run_id, scenario=scenario, error=f"{type(exc).__name__}: {exc}\n"
                         + traceback.format_exc(limit=5))
    write_diagnosis(run_dir, diag)
    return diag
