"""A real run killed at chosen points (stack start-up and mid-phase) by SIGTERM, SIGINT and
SIGKILL: TERM/INT leave a report and nothing else behind without any cleanup call; after KILL,
`kvchaos cleanup` with the run's state folder leaves nothing. (The acceptance size, 20 points
per signal at random times: scripts/kill_points.py, `make killpoints`.)"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from killpoints import Point, kill_point
from kvchaos_support import needs_redis, needs_root

DATA = Path(__file__).parent / "data"
pytestmark = [pytest.mark.slow, needs_redis, needs_root]
STARTED = "preparing the stack"  # the runner's first line once the suite starts

POINTS = [
    Point(signal.SIGTERM, 1.0, STARTED),   # stack start-up (the slow service is not healthy yet)
    Point(signal.SIGINT, 2.0, STARTED),    # stack start-up
    Point(signal.SIGTERM, 6.0, STARTED),   # mid-phase, the toxic in place
    Point(signal.SIGINT, 6.0, STARTED),    # mid-phase
    Point(signal.SIGKILL, 2.0, STARTED),   # stack start-up: processes and the mount orphaned
    Point(signal.SIGKILL, 6.0, STARTED),   # mid-phase: the toxic too
]


@pytest.mark.parametrize("point", POINTS, ids=lambda p: f"{p.sig.name}-{p.delay_s}s")
def test_kill_point_leaves_nothing(tmp_path, point):
    out = kill_point(DATA / "killpoint.yaml", point, tmp_path, timeout_s=120)
    assert out.sent_at_s is not None, "the run ended before the signal: " + out.output
    if point.sig == signal.SIGKILL:
        assert out.returncode == -signal.SIGKILL
        assert out.cleanup_rc == 0, out.output
    else:
        assert out.returncode == 128 + point.sig, out.output
        assert out.report and out.verdict == "interrupted", out.output
        expected = "stack start-up" if point.delay_s < 3 else "phase hold"
        assert out.stage == expected
    assert out.clean(), (out.leftovers, out.output)


def test_the_leftover_count_sees_what_a_killed_run_leaves(tmp_path):
    """Without cleanup, a run SIGKILLed mid-phase leaves one of each kind: the count is not
    blind (and `kvchaos cleanup` then removes all of it)."""
    from killpoints import leftovers, ports_of

    out = kill_point(DATA / "killpoint.yaml", Point(signal.SIGKILL, 6.0, STARTED), tmp_path, timeout_s=120,
                     cleanup_after_kill=False)
    left = out.leftovers
    assert len(left["processes"]) == 4 and len(left["mounts"]) == 1 and left["toxics"] == ["cache-link:slow-link"]
    assert len(left["ports"]) >= 4 and left["journal"], left
    env = dict(os.environ, KVCHAOS_STATE_DIR=str(tmp_path / "state"))
    r = subprocess.run([sys.executable, "-m", "chaos.cli", "cleanup"], env=env, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0 and "healed fault slow-link (latency)" in r.stdout, r.stdout + r.stderr
    state, reports = tmp_path / "state", tmp_path / "reports"
    after = leftovers(state, reports, set(left["ports"]) | ports_of(state, reports), None)
    assert not any(after.values()), after
