"""Guidance by the engine's branch coverage: a run that ran an engine branch no run before it
ran gets its fault-kind set the credit, read from the coverage.py data the engine saves under
the run's id (chaos/engine/measurement.py), as the reference engine writes it."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from chaos.explore.guidance import CounterGuide, branch_arcs


def _engine_like_process(data_dir: Path, contexts: list[tuple[str, int]]) -> None:
    """A process that measures a little module under contexts as the engine does (parallel data
    files, dynamic contexts switched by name, saved): ``contexts`` is (context, x) pairs, each
    calling ``f(x)``, whose branch depends on ``x``."""
    module = data_dir / "engine_like.py"
    module.write_text("def f(x):\n    if x > 0:\n        return 1\n    return 2\n")
    rc = data_dir / "coveragerc"
    rc.write_text(f"[run]\nbranch = True\nparallel = True\ndata_file = {data_dir / '.coverage'}\n"
                  f"include =\n    {module}\n")
    script = textwrap.dedent(f"""
        import sys, coverage
        cov = coverage.Coverage(config_file={str(rc)!r})
        cov.start()
        sys.path.insert(0, {str(data_dir)!r})
        import engine_like
        for ctx, x in {contexts!r}:
            cov.switch_context(ctx)
            engine_like.f(x)
        cov.stop()
        cov.save()
    """)
    subprocess.run([sys.executable, "-c", script], check=True)


def test_branch_arcs_are_the_runs_own_and_new_ones_get_the_credit(tmp_path: Path) -> None:
    _engine_like_process(tmp_path, [("run-a", 1), ("run-b", 1), ("run-c", -1)])
    a, b, c = (branch_arcs(tmp_path, ctx) for ctx in ("run-a", "run-b", "run-c"))
    assert a and a == b and c and c != a  # run-c took the other branch of `if x > 0`
    assert all(arc.startswith("engine_like.py:") for arc in a | c)
    assert branch_arcs(tmp_path, "run-x") == frozenset()  # a context nothing ran under
    assert branch_arcs(tmp_path / "none", "run-a") is None  # no data: the engine did not measure

    g = CounterGuide()
    assert g.record(["latency"], frozenset({"k"}), a) is True
    # the same counters and the same branches: nothing new
    assert g.record(["kill"], frozenset({"k"}), b) is False
    # the same counters, a branch never run before: new, credited to its fault-kind set
    assert g.record(["pause"], frozenset({"k"}), c) is True
    assert g.score(["pause"]) == 1.0 and g.score(["kill"]) == 0.0
    assert g.branches == a | c
