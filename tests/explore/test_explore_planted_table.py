"""benchmarks/explore_planted.py: what it reads from an exploration's summary.json and the medians
it prints (issue 33, acceptance 1: runs and minutes to the first finding per planted bug, median
of 3 seeds, a seed that found nothing counting as more than its budget)."""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))

import explore_planted as ep  # noqa: E402


def sig(index: int, elapsed: float, text: str, attributed: bool | None, known: str | None = None) -> dict:
    return {"signature": text, "first_run_index": index, "first_elapsed_s": elapsed,
            "attributed_to_bug": attributed, "known": known}


def test_first_finding_is_the_earliest_signature_the_control_attributed_to_the_bug() -> None:
    summary = {"signatures": [
        sig(0, 50.0, "checks=leaks | diagnosis=- | faults=latency", False),  # the clean stack's own
        sig(1, 90.0, "checks=leaks | diagnosis=- | faults=-", True, known="slow-l2-read-lock-leak"),
        sig(3, 200.0, "checks=recompute_equivalence | diagnosis=prefix_length | faults=-", True),
        sig(2, 150.0, "checks=isolation | diagnosis=key_identity | faults=-", True),
    ]}
    assert ep.first_finding(summary) == {"runs": 3, "minutes": 2.5,
                                         "signature": "checks=isolation | diagnosis=key_identity | faults=-"}
    assert ep.first_finding({"signatures": [sig(0, 50.0, "s", None)]}) is None
    assert ep.first_finding({}) is None


def test_a_seed_that_found_nothing_counts_above_any_found_one_in_the_median() -> None:
    rows = [{"found": True, "runs": 1, "minutes": 0.9}, {"found": False},
            {"found": True, "runs": 4, "minutes": 2.9}]
    assert ep.median_of(rows, "runs") == 4
    assert ep.median_of(rows, "minutes") == 2.9
    assert ep.median_of([{"found": False}, {"found": False}, rows[0]], "runs") == float("inf")
    assert ep.median_of([], "runs") is None


def test_table_has_a_row_per_exploration_and_a_median_line_per_bug() -> None:
    base = {"load_start": 3.0, "load_end": 5.5, "run_count": 6, "elapsed_s": 390.0,
            "stopped_by": "budget 360s", "exit": 0}
    rows = [{**base, "bug": "b1", "seed": 1, "found": True, "runs": 2, "minutes": 1.5, "signature": "s1"},
            {**base, "bug": "b2", "seed": 1, "found": False},
            {**base, "bug": "b1", "seed": 2, "found": False}]
    text = ep.table(rows).splitlines()
    assert text[2] == "| b1 | 1 | 2 | 1.5 | `s1` | 3.0 / 5.5 |"
    assert text[3].startswith("| b1 | 2 | - | - | not found: 6 runs, 6.5 min (budget 360s; exit 0)")
    assert text[4] == "| **b1** | **median of 2** | **-** | **-** | found with 1 of 2 seeds | |"
    assert text[6] == "| **b2** | **median of 1** | **-** | **-** | found with 0 of 1 seeds | |"
