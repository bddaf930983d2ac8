"""The engine's self-measurement (chaos/engine/measurement.py): coverage.py started from the
environment, one dynamic context per scenario read from the context file, data saved while
running so that a SIGKILLed engine keeps what it ran."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import coverage

PROBE = textwrap.dedent("""\
    import os, signal, sys, time
    from pathlib import Path
    from chaos.engine.measurement import start_coverage_from_environment
    cov = start_coverage_from_environment(interval_s=0.1)
    assert cov is not None
    sys.path.insert(0, sys.argv[1])
    import target
    ctx = Path(os.environ["KVCHAOS_ENGINE_COVERAGE"]).parent / "context"
    target.first()
    time.sleep(0.5)
    ctx.write_text("clean/two\\n")
    time.sleep(0.5)
    target.second()
    time.sleep(0.5)
    os.kill(os.getpid(), signal.SIGKILL)   # no atexit: only the periodic saves count
""")

TARGET = textwrap.dedent("""\
    def first():
        return 1

    def second():
        return 2
""")


def test_contexts_switch_and_data_survives_sigkill(tmp_path: Path) -> None:
    (tmp_path / "target.py").write_text(TARGET)
    rc = tmp_path / "coveragerc"
    rc.write_text(f"[run]\nbranch = True\nparallel = True\ndata_file = {tmp_path / '.coverage'}\n"
                  f"include =\n    {tmp_path / 'target.py'}\n")
    (tmp_path / "context").write_text("clean/one\n")
    env = {**os.environ, "KVCHAOS_ENGINE_COVERAGE": str(rc)}
    env.pop("COVERAGE_PROCESS_START", None)
    proc = subprocess.run([sys.executable, "-c", PROBE, str(tmp_path)], env=env, timeout=60,
                          capture_output=True, text=True)
    assert proc.returncode == -9, proc.stderr
    cov = coverage.Coverage(data_file=str(tmp_path / ".coverage"), config_file=str(rc))
    cov.combine([str(tmp_path)], keep=True)
    data = cov.get_data()
    target = str(tmp_path / "target.py")
    lines = {}
    for ctx in ("clean/one", "clean/two"):
        data.set_query_contexts([f"^{ctx}$"])
        lines[ctx] = set(data.lines(target) or [])
    assert 2 in lines["clean/one"] and 5 not in lines["clean/one"]
    assert 5 in lines["clean/two"] and 2 not in lines["clean/two"]


def test_nothing_runs_without_the_variable(monkeypatch) -> None:
    from chaos.engine.measurement import start_coverage_from_environment

    monkeypatch.delenv("KVCHAOS_ENGINE_COVERAGE", raising=False)
    assert start_coverage_from_environment() is None
    monkeypatch.setenv("KVCHAOS_ENGINE_COVERAGE", "")
    assert start_coverage_from_environment() is None


def test_context_defaults_to_idle(tmp_path: Path) -> None:
    from chaos.engine.measurement import read_context

    rc = tmp_path / "coveragerc"
    assert read_context(rc) == "idle"
    (tmp_path / "context").write_text("\n")
    assert read_context(rc) == "idle"
    (tmp_path / "context").write_text("clean/smoke\n")
    assert read_context(rc) == "clean/smoke"
