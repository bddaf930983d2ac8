"""``kvchaos shrink`` on a real catch (the reference stack, a planted bug): the result has at most
2 phases and 8 requests, fails the same check in 3 of 3 reruns, loads as a normal scenario and
fails again when run as one. Marked slow (one stack, a few dozen short runs: about 2 minutes)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from chaos.runner.run import run_scenario
from chaos.runner.stacks import StackPool
from chaos.runner.suite import load_and_validate
from chaos.scenario.loader import load_scenario
from chaos.shrink.cli import run_shrink
from chaos.stack.base import new_run_id

REPO = Path(__file__).resolve().parents[2]
STACK = REPO / "compose" / "reference.yml"

SCENARIO = f"""\
name: shrink-me
description: two phases of warm and hit requests with an off-by-one-chunk hit length planted
stack: {STACK}
seed: 11
engine: {{bugs: [hit-plus-one-chunk]}}
workload: {{families: 2, prefix_tokens: [300, 520], suffix_tokens: 8, requests: 6, concurrency: 2, max_tokens: 6,
           stream: 0.5}}
phases:
  - name: warm
  - name: hit
checks:
  recompute_equivalence: {{}}
  liveness: {{request_deadline_s: 60}}
"""


@pytest.mark.slow
def test_shrink_a_caught_bug_to_a_small_scenario(tmp_path: Path, monkeypatch, reference_pool: StackPool) -> None:
    """On the session's pool of reference stacks (tests/conftest.py ``reference_pool``)."""
    monkeypatch.setenv("KVCHAOS_DIAGNOSE", "0")
    path = tmp_path / "shrink-me.yaml"
    path.write_text(SCENARIO)
    (scenario,) = load_and_validate([path])
    pool = reference_pool
    stack = pool.acquire(STACK, scenario.stack_variables())
    run_dir = tmp_path / "run"
    result = run_scenario(scenario, stack, run_dir, run_id=new_run_id("shrink-me"), timeout_s=180)
    assert result.verdict == "failed"
    pool.release(STACK, result)
    res, out = run_shrink(run_dir, budget_s=150, pool=pool)
    assert res.verified == res.reruns == 3
    assert res.final["phases"] <= 2 and res.final["requests"] <= 8, res.final
    assert res.final["requests"] < res.original["requests"]
    shrunk = load_scenario(out)  # a normal scenario file
    assert shrunk.engine.bugs == ["hit-plus-one-chunk"] and shrunk.checks.enabled() == ["recompute_equivalence"]
    assert (run_dir / "shrink.json").is_file()
    (again,) = load_and_validate([out])
    stack = pool.acquire(Path(again.stack), again.stack_variables())
    rerun = run_scenario(again, stack, tmp_path / "rerun", run_id=new_run_id("shrunk"), timeout_s=120)
    pool.release(Path(again.stack), rerun)
    assert [c.verdict for c in rerun.checks] == ["failed"]
    assert os.path.relpath(Path(shrunk.stack).resolve(), REPO).startswith("compose")
