"""Signals from the first instruction of the `kvchaos` entry point (chaos/entry.py).

The input that showed it: a SIGINT or SIGTERM while `kvchaos run` was still importing (2-3 s on
an idle host, 11 s on a busy one) gave a KeyboardInterrupt traceback or a silent death, with no
result.json and no suite report. Now every such signal leaves the reports with verdict
``interrupted`` (stage "start-up" when nothing had started) and exit 130 / 143. The acceptance
size (20 SIGINT + 20 SIGTERM): scripts/startup_signals.py (`make startup-signals`).
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from chaos import interrupts
from kvchaos_support import default_sigint

REPO = Path(__file__).resolve().parents[2]
KVCHAOS = REPO / ".venv" / "bin" / "kvchaos"
SCENARIO = REPO / "tests" / "runner" / "data" / "idle-link.yaml"

_spec = importlib.util.spec_from_file_location("startup_signals", REPO / "scripts" / "startup_signals.py")
startup_signals = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(startup_signals)

needs_console_script = pytest.mark.skipif(not KVCHAOS.exists(), reason="no .venv/bin/kvchaos (scripts/setup.sh)")


def _lasting(tmp_path: Path, seconds: int) -> Path:
    """idle-link.yaml with its phase lasting ``seconds`` (beside a copy of its stack file): a
    run that is still under way at the last signal on any host. With the file's own 1 s, a quiet
    host finished the whole run within 2.5 s, and the signal met the suite's report (CI of
    b4d5fcf: "idle-link-...: verdict unknown", the run's own, inconclusive by design)."""
    folder = tmp_path / "scenario"
    folder.mkdir()
    shutil.copy(SCENARIO.parent / "proxy-redis-idle.yml", folder)
    text = SCENARIO.read_text()
    assert "duration: 1s" in text
    path = folder / SCENARIO.name
    path.write_text(text.replace("duration: 1s", f"duration: {seconds}s"))
    return path


@needs_console_script
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_signals_in_the_first_seconds_of_run_leave_an_interrupted_report(tmp_path, sig):
    """Three runs per signal, the signal sent at 0.25 s, 1.25 s and 2.5 s (the first while the
    modules load, on any host): each exits 128 + the signal, prints no traceback, and leaves a
    suite report and a run report with verdict ``interrupted``."""
    stages = []
    scenario = _lasting(tmp_path, 6)
    for i, delay in enumerate((0.25, 1.25, 2.5)):
        case = startup_signals.one_case(KVCHAOS, scenario, tmp_path / f"case-{i}", sig, delay, timeout_s=240)
        assert not case["problems"], case
        stages.append(case["stage"])
        if case["stage"] == interrupts.STARTUP:
            run_dir = next(p for p in (tmp_path / f"case-{i}" / "reports").iterdir() if "suite" not in p.name)
            result = json.loads((run_dir / "result.json").read_text())
            assert result["interrupted"]["stage"] == "start-up" and result["exit_code"] == 128 + sig
            assert "during start-up" in (tmp_path / f"case-{i}" / "stderr.txt").read_text()
    assert stages[0] == interrupts.STARTUP, stages  # 0.25 s: no host loads kvchaos that fast


@needs_console_script
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_another_command_interrupted_while_it_loads_exits_at_once(tmp_path, sig):
    """Commands that write no report (validate here; a stack's `kvchaos engine serve` services
    too) exit 128 + the signal at once while they load, saying so, with no traceback."""
    proc = subprocess.Popen([str(KVCHAOS), "validate", str(REPO / "scenarios" / "smoke.yaml")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=default_sigint)
    while not startup_signals.catches(proc.pid, signal.SIGTERM):
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.001)
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + sig, (out, err)
    assert f"interrupted ({signal.Signals(sig).name} during start-up)" in err and "Traceback" not in err, err


def test_a_signal_held_during_start_up_is_raised_once_as_start_up():
    """In process: hold_startup() holds a signal (a second one too) until end_startup(), which
    raises it once with stage "start-up" and gives the previous handlers back."""
    before = signal.getsignal(signal.SIGTERM)
    interrupts.hold_startup()
    try:
        os.kill(os.getpid(), signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGINT)
        assert interrupts.holding_startup()
    finally:
        with pytest.raises(interrupts.RunInterrupted) as info:
            interrupts.end_startup()
    assert (info.value.signum, info.value.stage, info.value.exit_code) == (signal.SIGTERM, "start-up", 143)
    assert signal.getsignal(signal.SIGTERM) is before
    interrupts.end_startup()  # no hold: nothing


def test_the_entry_point_imports_nothing_heavy_before_its_handler():
    """What runs before the start-up mode is on: chaos/__init__ and chaos.interrupts, which need
    the standard library's light modules only (no asyncio, typer, pydantic, yaml, rich)."""
    code = ("import sys; before = set(sys.modules); import chaos.entry, chaos.interrupts; "
            "print(' '.join(sorted(set(sys.modules) - before)))")
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    heavy = [m for m in loaded if m.split(".")[0] in ("asyncio", "typer", "pydantic", "yaml", "rich", "click", "httpx",
                                                      "torch", "numpy")]
    assert not heavy, heavy


def test_the_stage_after_start_up_is_never_none():
    """The input that showed it: SIGINT 2.5 s into `kvchaos run` (CI, stop 35), after the
    validation and before the stack pool named "stack start-up", left a suite report with no
    stage. end_startup(then=...) hands the stage straight over."""
    with interrupts.handling():  # as `kvchaos run` (chaos/cli.py): the run's own handling block
        interrupts.hold_startup()
        assert interrupts.current_stage() == interrupts.STARTUP
        interrupts.end_startup(then=interrupts.SUITE_START)
        assert interrupts.current_stage() == interrupts.SUITE_START
    assert interrupts.current_stage() is None


def test_a_signal_while_the_suite_prepares_a_run_names_that_stage(tmp_path, monkeypatch):
    """A signal between the end of start-up and the stack's start-up (the run's folder being
    named) gives the suite report a stage: "preparing <scenario>"; no stack was started."""
    from chaos.runner import suite as suite_mod
    from chaos.scenario.loader import load_scenario

    scenario = load_scenario(REPO / "scenarios" / "smoke.yaml")
    real = suite_mod.prepare_run

    def prepare_and_signal(sc, opts):
        out = real(sc, opts)
        os.kill(os.getpid(), signal.SIGTERM)
        return out

    monkeypatch.setattr(suite_mod, "prepare_run", prepare_and_signal)
    opts = suite_mod.SuiteOptions(backend="local", report_dir=tmp_path)
    with pytest.raises(interrupts.RunInterrupted) as info:
        suite_mod.run_suite([scenario], opts)
    assert info.value.stage == "preparing smoke", info.value.stage
    suite = json.loads((info.value.suite_dir / "suite.json").read_text())
    assert suite["interrupted"]["stage"] == "preparing smoke"
    assert [r["verdict"] for r in suite["runs"]] == ["interrupted"], suite["runs"]
    assert not (info.value.suite_dir / "stacks").exists()


def test_the_judge_lets_a_run_that_ended_before_the_signal_keep_its_verdict(tmp_path):
    """A suite of two runs, the first passed before the signal met the second: the judge asks
    `interrupted` of the run the signal met only (it used to ask it of every run, so a
    multi-scenario --scenario folder failed every case whose signal came after the first run).
    A run the signal met that says otherwise, a run after an interrupted one that says
    otherwise, and a missing result.json are still problems."""
    def suite(*verdicts):
        runs = []
        for verdict in verdicts:
            run_dir = tmp_path / f"run-{len(list(tmp_path.iterdir()))}"
            run_dir.mkdir()
            if verdict is not None:
                (run_dir / "result.json").write_text(json.dumps({"verdict": verdict}))
            runs.append({"run_dir": run_dir.name})
        return runs

    assert startup_signals.run_problems(tmp_path, suite("passed", "interrupted")) == []
    assert startup_signals.run_problems(tmp_path, suite("interrupted")) == []
    assert startup_signals.run_problems(tmp_path, []) == ["no run report"]
    assert any("the run the signal met" in p for p in startup_signals.run_problems(tmp_path, suite("interrupted", "passed")))
    assert any("after an interrupted run" in p
               for p in startup_signals.run_problems(tmp_path, suite("interrupted", "failed", "interrupted")))
    assert any("no result.json" in p for p in startup_signals.run_problems(tmp_path, suite("passed", None)))
