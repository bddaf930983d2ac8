"""A real run killed at chosen points (stack start-up and mid-phase) by SIGTERM, SIGINT and
SIGKILL: TERM/INT leave a report and nothing else behind without any cleanup call; after KILL,
`kvchaos cleanup` with the run's state folder leaves nothing. (The acceptance size, 20 points
per signal at random times: scripts/kill_points.py, `make killpoints`.)"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from killpoints import Point, kill_point
from kvchaos_support import needs_redis, needs_root

DATA = Path(__file__).parent / "data"
pytestmark = [pytest.mark.slow, needs_redis, needs_root]

POINTS = [
    Point(signal.SIGTERM, 1.0, "@process"),  # stack start-up (the slow service is not healthy yet)
    Point(signal.SIGINT, 2.0, "@process"),   # stack start-up
    Point(signal.SIGTERM, 1.0, "@fault"),    # mid-phase, the toxic in place
    Point(signal.SIGINT, 1.0, "@fault"),     # mid-phase
    Point(signal.SIGKILL, 2.0, "@process"),  # stack start-up: processes and the mount orphaned
    Point(signal.SIGKILL, 1.0, "@fault"),    # mid-phase: the toxic too
]


@pytest.mark.parametrize("point", POINTS, ids=lambda p: f"{p.sig.name}-{p.after[1:]}")
def test_kill_point_leaves_nothing(tmp_path, point):
    out = kill_point(DATA / "killpoint.yaml", point, tmp_path, timeout_s=120)
    assert out.sent_at_s is not None, "the run ended before the signal: " + out.output
    if point.sig == signal.SIGKILL:
        assert out.returncode == -signal.SIGKILL
        assert out.cleanup_rc == 0, out.output
    else:
        assert out.returncode == 128 + point.sig, out.output
        assert out.report and out.verdict == "interrupted", out.output
        assert out.stage == ("stack start-up" if point.after == "@process" else "phase hold")
    assert out.clean(), (out.leftovers, out.output)


def test_the_leftover_count_sees_what_a_killed_run_leaves(tmp_path):
    """Without cleanup, a run SIGKILLed mid-phase leaves one of each kind: the count is not
    blind (and `kvchaos cleanup` then removes all of it)."""
    from killpoints import leftovers, ports_of

    out = kill_point(DATA / "killpoint.yaml", Point(signal.SIGKILL, 1.0, "@fault"), tmp_path, timeout_s=120,
                     cleanup_after_kill=False)
    env = dict(os.environ, KVCHAOS_STATE_DIR=str(tmp_path / "state"))
    cleaned = None
    try:
        left = out.leftovers
        assert len(left["processes"]) == 4 and len(left["mounts"]) == 1, left
        assert left["toxics"] == ["cache-link:slow-link"] and len(left["ports"]) == 4 and left["journal"], left
    finally:  # whatever the assertions say, leave nothing behind
        cleaned = subprocess.run([sys.executable, "-m", "chaos.cli", "cleanup"], env=env, capture_output=True,
                                 text=True, timeout=120)
    assert cleaned.returncode == 0 and "healed fault slow-link (latency)" in cleaned.stdout, \
        cleaned.stdout + cleaned.stderr
    state, reports = tmp_path / "state", tmp_path / "reports"
    after = leftovers(state, reports, set(left["ports"]) | ports_of(state, reports), None)
    assert not any(after.values()), after


def _catalogue(tmp_path: Path) -> Path:
    cat = tmp_path / "catalogue"
    cat.mkdir()
    for name in ("killpoint.yaml", "killpoint-stack.yml"):
        shutil.copy(DATA / name, cat / name)
    return cat


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_zoo_interrupted_during_stack_start_up(tmp_path, sig):
    from chaos.engine.bugs import BUGS

    cat = _catalogue(tmp_path)
    zoo = [sys.executable, "-m", "chaos.zoo", "--catalogue", str(cat), "--scenarios", "killpoint",
           "--bug", sorted(BUGS)[0], "--out", str(tmp_path / "zoo"), "--report-dir", "{reports}"]
    out = kill_point(cat / "killpoint.yaml", Point(sig, 1.0, "@process"), tmp_path / "w", timeout_s=120,
                     command=zoo)
    assert out.returncode == 128 + sig, out.output
    assert out.report and out.verdict == "interrupted" and out.stage == "stack start-up", out.output
    assert f"Interrupted by {sig.name} during stack start-up" in (tmp_path / "zoo" / "matrix.md").read_text()
    assert out.clean(), (out.leftovers, out.output)


@pytest.mark.parametrize("sig, after", [(signal.SIGTERM, "@process"), (signal.SIGINT, "@fault")])
def test_pytest_plugin_interrupted(tmp_path, sig, after):
    cat = _catalogue(tmp_path)
    (tmp_path / "w").mkdir()
    (tmp_path / "w" / "pytest.ini").write_text("[pytest]\n")
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-m", "chaos", "--kvchaos-scenarios",
           str(cat), "--kvchaos-report-dir", "{reports}", str(cat)]
    out = kill_point(cat / "killpoint.yaml", Point(sig, 1.0, after), tmp_path / "w", timeout_s=120, command=cmd)
    assert out.returncode == 128 + sig, out.output
    assert out.report and out.verdict == "interrupted", out.output
    assert out.stage == ("stack start-up" if after == "@process" else "phase hold")
    assert out.clean(), (out.leftovers, out.output)


@pytest.mark.parametrize("sig, after", [(signal.SIGTERM, "@fault"), (signal.SIGINT, "@process")])
def test_pytest_xdist_controller_interrupted(tmp_path, sig, after):
    """`pytest -m chaos -n 2`: the signal goes to the xdist controller alone (as `kill` sends it),
    which runs no scenario itself. It is forwarded to the workers: the one running the scenario
    heals, reports `interrupted`, brings its stack down, and the controller exits 128 + signal
    only after that, leaving nothing (without the forwarding, SIGTERM kills the controller at
    once and xdist's own teardown SIGKILLs workers whose stacks are still up)."""
    cat = _catalogue(tmp_path)
    (tmp_path / "w").mkdir()
    (tmp_path / "w" / "pytest.ini").write_text("[pytest]\n")
    cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-m", "chaos", "-n", "2",
           "--kvchaos-scenarios", str(cat), "--kvchaos-report-dir", "{reports}", str(cat)]
    out = kill_point(cat / "killpoint.yaml", Point(sig, 1.0, after), tmp_path / "w", timeout_s=180, command=cmd)
    assert out.returncode == 128 + sig, out.output
    assert out.report and out.verdict == "interrupted", out.output
    assert out.stage == ("stack start-up" if after == "@process" else "phase hold")
    assert out.clean(), (out.leftovers, out.output)
