"""Every applied fault is healed on every exit path; a SIGKILLed runner is undone by
`kvchaos cleanup` from its journal."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psutil
import pytest

from chaos.journal import all_journals, open_entries
from chaos.stack.probe import listeners
from chaos.stack.spec import free_port
from kvchaos_support import communicate_or_dump, default_sigint

DATA = Path(__file__).parent / "data"
pytestmark = pytest.mark.slow


@pytest.fixture
def env(tmp_path):
    e = dict(os.environ)
    e["KVCHAOS_STATE_DIR"] = str(tmp_path / "state")
    ports = set()
    for name in ("TOXIPROXY_PORT", "REDIS_PORT", "REDIS_PROXY_PORT"):
        p = free_port(avoid=ports)
        ports.add(p)
        e[name] = str(p)
    return e


def start_run(env, tmp_path, scenario="hold-latency-long.yaml"):
    return subprocess.Popen([sys.executable, "-m", "chaos.cli", "run", str(DATA / scenario),
                             "--report-dir", str(tmp_path / "reports")], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            preexec_fn=default_sigint)


def wait_for_toxic(env, timeout_s=60.0) -> list:
    api = f"http://127.0.0.1:{env['TOXIPROXY_PORT']}"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            r = httpx.get(f"{api}/proxies/cache-link/toxics", timeout=1)
            toxics = r.json()
            if r.status_code == 200 and toxics:
                return toxics
        except (httpx.HTTPError, ValueError):
            pass
        time.sleep(0.2)
    raise AssertionError("the fault was never applied")


def wait_for_report(tmp_path: Path, timeout_s: float = 120.0) -> None:
    """Until the run's report is written (an event, not a guess of how long the runner takes
    to get there on a loaded machine). A second Ctrl-C before it (during the heal) is runner
    signal handling, not tested here."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if any((d / "report.html").exists() for d in (tmp_path / "reports").glob("hold-latency-long*")):
            return
        time.sleep(0.05)
    raise AssertionError("the runner never wrote its report")


def journal_processes(state: Path) -> list[dict]:
    return [e for j in all_journals(state / "journal") for e in open_entries(j) if e["kind"] == "process"]


def alive(entry: dict) -> bool:
    try:
        p = psutil.Process(entry["pid"])
        return abs(p.create_time() - entry["create_time"]) < 1 and p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_sigkill_mid_fault_then_cleanup_leaves_nothing(env, tmp_path):
    runner = start_run(env, tmp_path)
    try:
        assert wait_for_toxic(env)[0]["name"] == "slow-link"
        runner.send_signal(signal.SIGKILL)
        runner.wait(10)
    finally:
        if runner.poll() is None:
            runner.kill()
    state = Path(env["KVCHAOS_STATE_DIR"])
    procs = journal_processes(state)
    assert {e["service"] for e in procs} == {"redis", "toxiproxy", "pinger"}
    assert all(alive(e) for e in procs)  # orphaned by the kill
    assert wait_for_toxic(env, 2)  # and the toxic is still in place

    r = subprocess.run([sys.executable, "-m", "chaos.cli", "cleanup"], env=env, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "healed fault slow-link (latency)" in r.stdout
    assert not any(alive(e) for e in procs)
    for name in ("TOXIPROXY_PORT", "REDIS_PORT", "REDIS_PROXY_PORT"):
        # Another program on a shared host may bind the port since; none of ours may hold it.
        assert not [o for o in listeners(int(env[name])) if o.pid in {e["pid"] for e in procs}], name
    assert list(all_journals(state / "journal")) == []
    r = subprocess.run([sys.executable, "-m", "chaos.cli", "cleanup"], env=env, capture_output=True, text=True)
    assert "nothing to clean up" in r.stdout


@pytest.mark.parametrize("sig,times", [(signal.SIGTERM, 1), (signal.SIGINT, 1), (signal.SIGINT, 2)])
def test_signal_mid_fault_heals_and_keeps_the_report(env, tmp_path, sig, times):
    """Also a second Ctrl-C while it heals and stops the stack (an impatient user; it used to
    abort the teardown and leave the stack's processes running)."""
    runner = start_run(env, tmp_path)
    try:
        wait_for_toxic(env)
        state = Path(env["KVCHAOS_STATE_DIR"])
        procs = journal_processes(state)
        runner.send_signal(sig)
        for _ in range(times - 1):
            wait_for_report(tmp_path)  # healed and reported: the Ctrl-C meets the stack's stop
            runner.send_signal(sig)
        out = communicate_or_dump(runner, 300, env["KVCHAOS_STATE_DIR"])
    finally:
        if runner.poll() is None:
            runner.kill()
    assert runner.returncode not in (0, 1), out
    assert "interrupted" in out
    runs = [d for d in (tmp_path / "reports").iterdir() if d.name.startswith("hold-latency-long")]
    assert len(runs) == 1
    history = [json.loads(line) for line in (runs[0] / "history.jsonl").read_text().splitlines()]
    heals = [op for op in history if op["f"] == "heal" and op["type"] == "ok"]
    assert [op["fault_id"] for op in heals] == ["slow-link"]
    assert heals[0]["value"]["removed"] is True
    assert (runs[0] / "result.json").exists() and (runs[0] / "report.html").exists()
    assert not any(alive(e) for e in procs)
    assert list(all_journals(state / "journal")) == []
