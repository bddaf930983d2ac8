"""Timing premises: a window that rests on a TTL of the system under test is proven, or the run
is inconclusive (a phase's ``ends_within``, ``checks.leaks.back_within``).

The input that showed it: scenarios/findings/frozen-l2-locks-outlive-read-ttl.yaml in the third
run of `make catalogue-loaded` (2026-12-03, 4 busy loops): its frozen phase took 19 s instead of
6 s, so hot-a's lookups came 29 s after the lookups that leaked the read locks, past LMCache's
20 s read-lock TTL; the locks expired as designed, the leaks check found nothing held, and the
finding XPASSed: a false pass, with its fault bitten and both triggers reached.
"""

from __future__ import annotations

import pytest

from chaos.checks import LeakSample, Snapshots, evidence, leaks
from chaos.history import HistoryWriter
from chaos.runner.run import Nemesis
from chaos.scenario.loader import load_scenario
from chaos.scenario.model import Phase
from chaos.yamlsource import ConfigError


class Clock:
    """A hand-moved monotonic clock."""

    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def _run(phases: list[tuple[Phase, float]]) -> list[dict]:
    """The ops the runner's nemesis records for ``phases``, each lasting the given seconds."""
    clock = Clock()
    history = HistoryWriter(clock=clock)
    nemesis = Nemesis(None, history, None, None)  # type: ignore[arg-type]  # phases only
    for phase, took in phases:
        nemesis.phase_started(phase.name)
        clock.t += took
        nemesis.phase_ended(phase)
    return [op.model_dump() for op in history.ops]


def _phase(name: str, s: float | None = None, since: str | None = None) -> Phase:
    return Phase.model_validate({"name": name, **({"ends_within": {"s": s, "phase": since}} if s else {})})


# The finding's shape: the lookups of `frozen` leak the locks, `hot-a` must renew them in time.
QUIET = [(_phase("frozen"), 6.0), (_phase("idle-a"), 5.0), (_phase("hot-a", 36, "frozen"), 0.5)]
STRETCHED = [(_phase("frozen"), 19.0), (_phase("idle-a"), 5.0), (_phase("hot-a", 18, "frozen"), 4.0)]


def test_a_phase_that_ends_in_time_keeps_its_premise():
    ops = _run(QUIET)
    [window] = evidence.phase_windows(ops)
    assert window["reached"] is True and window["since_phase"] == "frozen"
    assert window["took_s"] == pytest.approx(11.5)
    r = evidence.check(ops, Snapshots(), {})
    assert r.verdict == "passed" and "timing premises kept: 1 of 1" in r.summary, r.summary


def test_a_stretched_run_is_inconclusive_never_passed():
    r = evidence.check(_run(STRETCHED), Snapshots(), {})
    assert r.verdict == "unknown", r.summary
    assert "phase hot-a: timing premise missed: ended 28.0s after the start of phase frozen" in r.summary
    assert "later than ends_within 18s" in r.summary
    assert r.details["phases"][-1]["window_kept"] is False


def test_the_default_reference_is_the_phase_itself():
    phase = Phase.model_validate({"name": "burst", "ends_within": {"s": 2}})
    r = evidence.check(_run([(phase, 3.0)]), Snapshots(), {})
    assert r.verdict == "unknown" and "ended 3.0s after its own start" in r.summary
    assert evidence.check(_run([(phase, 1.0)]), Snapshots(), {}).verdict == "passed"


def test_no_premise_records_no_window():
    ops = _run([(_phase("warm"), 1.0)])
    assert evidence.phase_windows(ops) == []
    # the phase's start (what back_within counts from) and end (the report's phase span)
    assert [(op["f"], op["value"]) for op in ops] == [("phase", {"event": "start"}), ("phase", {"event": "end"})]


def _quiet_at(t: float, value: float = 0) -> Snapshots:
    return Snapshots(leak_samples=[LeakSample(source="lmcache", time=t, values={"read_locked_count": value})])


def test_a_leaks_pass_after_back_within_is_inconclusive():
    ops = _run(QUIET + [(_phase("hot-c"), 0.5)])  # hot-c starts at 11.5 s of the run
    cfg = {"quiesce_s": 25, "back_within": {"s": 36, "phase": "hot-c"}}
    assert leaks.check(ops, _quiet_at(30.0), cfg).verdict == "passed"
    late = leaks.check(ops, _quiet_at(48.0), cfg)
    assert late.verdict == "unknown", late.summary
    assert "back at baseline only 36.5s after the start of phase hot-c, later than back_within 36s" in late.summary
    assert late.details["back_within"]["took_s"] == pytest.approx(36.5)
    # a lock still held is a failure whenever it is seen
    assert leaks.check(ops, _quiet_at(48.0, 14), cfg).verdict == "failed"
    # without the premise the same late pass is a pass (what the finding reported before)
    assert leaks.check(ops, _quiet_at(48.0), {"quiesce_s": 25}).verdict == "passed"


def test_back_within_counts_from_the_first_phase_by_default_and_needs_its_start():
    ops = _run(QUIET)
    assert leaks.check(ops, _quiet_at(9.0), {"back_within": {"s": 10}}).verdict == "passed"
    assert leaks.check(ops, _quiet_at(11.0), {"back_within": {"s": 10}}).verdict == "unknown"
    r = leaks.check(ops, _quiet_at(1.0), {"back_within": {"s": 10, "phase": "never"}})
    assert r.verdict == "unknown" and "never started" in r.summary


@pytest.fixture
def write(tmp_path):
    """write(text) -> path of a scenario file next to a minimal stack file."""
    from tests.scenario.samples import STACK

    (tmp_path / "stack.yml").write_text(STACK)

    def _write(text: str):
        path = tmp_path / "s.yaml"
        path.write_text(text)
        return path

    return _write


SCENARIO = """\
name: premises
stack: stack.yml
phases:
  - name: frozen
  - name: hot-a
    ends_within: {s: 18, phase: frozen}
checks:
  leaks: {back_within: {s: 18, phase: hot-a}}
  evidence: {}
"""


def test_premises_load_and_bad_references_are_errors_at_their_line(write):
    s = load_scenario(write(SCENARIO))
    assert (s.phases[1].ends_within.s, s.phases[1].ends_within.phase) == (18.0, "frozen")
    assert s.checks.leaks.back_within.phase == "hot-a"
    with pytest.raises(ConfigError) as ei:
        load_scenario(write(SCENARIO.replace("phase: frozen}", "phase: hot-b}")))
    assert (ei.value.line, ei.value.field) == (6, "phases[1].ends_within.phase")
    assert "'hot-b' is not this phase or an earlier one" in ei.value.message
    with pytest.raises(ConfigError) as ei:  # a later phase cannot be the reference
        load_scenario(write(SCENARIO.replace("  - name: hot-a\n    ends_within: {s: 18, phase: frozen}\n", "")
                            .replace("  - name: frozen\n", "  - name: frozen\n    ends_within: {s: 1, phase: hot-a}\n"
                                     "  - name: hot-a\n")))
    assert ei.value.line == 5 and "not this phase or an earlier one" in ei.value.message
    with pytest.raises(ConfigError) as ei:
        load_scenario(write(SCENARIO.replace("phase: hot-a}}", "phase: hot-z}}")))
    assert (ei.value.line, ei.value.field) == (8, "checks.leaks.back_within.phase")
    with pytest.raises(ConfigError) as ei:
        load_scenario(write(SCENARIO.replace("  evidence: {}\n", "")))
    assert "declare `ends_within`, which the `evidence` check evaluates" in ei.value.message
    with pytest.raises(ConfigError) as ei:
        load_scenario(write(SCENARIO.replace("{s: 18, phase: frozen}", "{s: 0, phase: frozen}")))
    assert ei.value.field == "phases[1].ends_within.s"


def test_the_guide_example_loads(write):
    import re
    from pathlib import Path

    guide = (Path(__file__).resolve().parents[2] / "docs" / "scenarios.md").read_text()
    [example] = [e for e in re.findall(r"```yaml\n(.*?)```", guide, re.S) if "ends_within" in e]
    s = load_scenario(write("name: guide\nstack: stack.yml\n" + example))
    assert s.phases[-1].ends_within.s == 18 and s.checks.leaks.back_within.phase == "hot-a"
