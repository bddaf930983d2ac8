"""SIGINT/SIGTERM become one RunInterrupted, held where an exception must not split a step;
interrupted runs are reported as such (verdict interrupted, 130/143)."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import pytest

from chaos import interrupts
from chaos.interrupts import RunInterrupted
from chaos.report.junit import run_testsuite
from chaos.report.model import InterruptInfo
from chaos.report.result import build_result
from chaos.report.suite import build_suite, suite_exit_code, suite_table
from chaos.report.writer import write_report


@pytest.fixture(autouse=True)
def sigint_as_a_terminal_gives_it():
    """SIGINT with Python's own handler for each test, as a shell in a terminal starts pytest.

    The input that showed it: `make test-loaded` started in the background by a script (no job
    control) runs pytest with SIGINT ignored, inherited; kvchaos keeps an ignored signal
    ignored on purpose, so five of these tests, which send themselves SIGINT, failed for that
    alone (DID NOT RAISE RunInterrupted). Restored afterwards."""
    old = signal.getsignal(signal.SIGINT)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, old)


def test_the_first_signal_raises_with_its_stage_and_later_ones_are_held():
    seen = []
    with pytest.raises(RunInterrupted) as ei:
        with interrupts.handling():
            interrupts.set_stage("phase warm")
            try:
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(1)
            finally:
                # the teardown: another signal must not cut it short
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(0.05)
                seen.append("teardown done")
    assert seen == ["teardown done"]
    e = ei.value
    assert (e.signum, e.signal_name, e.exit_code, e.stage) == (signal.SIGTERM, "SIGTERM", 143, "phase warm")
    assert isinstance(e, KeyboardInterrupt)
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL  # the old handler is back


def test_deferred_holds_a_signal_until_the_block_ends():
    steps = []
    with pytest.raises(RunInterrupted) as ei:
        with interrupts.deferred():
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)
            steps.append("healed")
            steps.append("report written")
    assert steps == ["healed", "report written"]
    assert ei.value.exit_code == 130
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_sigint_is_never_reported_as_empty_parentheses():
    """The input that showed it: Ctrl-C was reported as "interrupted ()"."""
    assert interrupts.as_interrupt(KeyboardInterrupt()).describe() == "SIGINT"
    with interrupts.stage("checks"):
        assert str(interrupts.as_interrupt(KeyboardInterrupt())) == "SIGINT during checks"


def test_start_up_waits_stop_once_a_signal_came():
    with interrupts.handling():
        with interrupts.stage("stack start-up"):
            assert not interrupts.startup_interrupted()
            with pytest.raises(RunInterrupted):
                with interrupts.deferred():
                    os.kill(os.getpid(), signal.SIGTERM)
                    time.sleep(0.05)
                    assert interrupts.startup_interrupted()
        with interrupts.stage("heal"):  # a heal that restarts a service still waits for it
            assert not interrupts.startup_interrupted()


def _interrupted_result(tmp_path):
    info = InterruptInfo(signal="SIGTERM", exit_code=143, stage="phase stall", phases_run=["warm", "stall"],
                         healed=["latency-0"])
    result = build_result(run_id="r1", scenario="s", history=[], checks=[], interrupted=info)
    write_report(tmp_path, result, [])
    return result


def test_an_interrupted_result_is_rendered_everywhere(tmp_path):
    result = _interrupted_result(tmp_path)
    assert (result.verdict, result.exit_code) == ("interrupted", 143)
    suite_xml = run_testsuite(result)
    err = suite_xml.find("testcase/error")
    assert err is not None and err.get("type") == "interrupted"
    assert err.get("message") == "interrupted by SIGTERM during phase stall; healed: latency-0"
    html = (tmp_path / "report.html").read_text()
    assert "Interrupted</b> by SIGTERM" in html and "phase stall" in html and "latency-0" in html
    suite = build_suite("suite-1", [result], tmp_path)
    assert (suite.verdict, suite.exit_code, suite.interrupted.signal) == ("interrupted", 143, "SIGTERM")
    assert suite_exit_code([result]) == 143
    from rich.console import Console

    console = Console(width=200, record=True)
    console.print(suite_table(suite))
    assert "interrupted by SIGTERM during phase stall" in console.export_text()


def test_a_signal_the_parent_ignores_stays_ignored():
    """A job a non-interactive shell starts with `&` has SIGINT ignored; kvchaos keeps it so."""
    old = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with interrupts.handling():
            assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
            assert signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, old)


def test_after_the_run_a_signal_only_sets_the_exit_code():
    """The input that showed it: SIGINT in the last instants of `kvchaos run` (report written,
    stacks down, handlers restored) ended the interpreter by the signal's default action."""
    old = {s: signal.getsignal(s) for s in interrupts.SIGNALS}
    try:
        interrupts.exit_on_signal()
        with pytest.raises(SystemExit) as ei:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(1)
        assert ei.value.code == 130
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def test_a_signal_inside_the_event_loop_cancels_the_task_and_is_raised_after_the_loop():
    """The input that showed it: SIGINT as the first request of phase warm was sent (compose
    backend, CI); raised where it landed inside the loop, the in-flight request's own
    ``except CancelledError`` (which records its completion) never ran, and one such run never
    came back. Now the signal cancels the task: the coroutine unwinds at an await."""
    steps = []

    async def phase() -> None:
        steps.append("invoke")
        try:
            os.kill(os.getpid(), signal.SIGINT)  # lands inside this task's step
            steps.append("step went on")  # the handler did not raise here
            await asyncio.sleep(5)
            steps.append("not reached")
        except asyncio.CancelledError:
            steps.append("completion recorded")
            await asyncio.sleep(0.05)  # a cleanup that awaits still runs (one cancellation)
            steps.append("cleanup awaited")
            raise

    with pytest.raises(RunInterrupted) as ei:
        with interrupts.handling(), interrupts.stage("phase warm"):
            interrupts.run_async(phase())
    assert steps == ["invoke", "step went on", "completion recorded", "cleanup awaited"]
    assert (ei.value.signum, ei.value.stage) == (signal.SIGINT, "phase warm")


def test_the_loop_joins_its_worker_threads_before_the_interrupt_is_raised():
    """A fault applied in a worker thread (asyncio.to_thread) is in place, and recorded, before
    the heal that the RunInterrupted leads to starts: no apply runs after the heal."""
    applied = []

    def apply() -> None:
        time.sleep(0.5)
        applied.append("applied")

    async def phase() -> None:
        asyncio.get_running_loop().call_later(0.1, os.kill, os.getpid(), signal.SIGTERM)
        await asyncio.to_thread(apply)
        await asyncio.sleep(5)

    with pytest.raises(RunInterrupted) as ei:
        with interrupts.handling():
            interrupts.run_async(phase())
    assert applied == ["applied"]
    assert ei.value.exit_code == 143


def test_a_signal_as_the_loop_finishes_is_still_raised_and_a_second_cancels_again():
    async def done_already() -> str:
        os.kill(os.getpid(), signal.SIGINT)  # cancel is scheduled; the task ends first
        return "finished"

    with pytest.raises(RunInterrupted):
        with interrupts.handling():
            interrupts.run_async(done_already())

    swallowed = []

    async def swallows_one_cancel() -> None:
        asyncio.get_running_loop().call_later(0.05, os.kill, os.getpid(), signal.SIGINT)
        try:
            await asyncio.sleep(5)
        except asyncio.CancelledError:
            swallowed.append("first")  # e.g. a wait_for race that eats a cancellation
            asyncio.get_running_loop().call_later(0.05, os.kill, os.getpid(), signal.SIGINT)
        await asyncio.sleep(5)  # the second signal cancels this

    t0 = time.monotonic()
    with pytest.raises(RunInterrupted) as ei:
        with interrupts.handling():
            interrupts.run_async(swallows_one_cancel())
    assert swallowed == ["first"] and time.monotonic() - t0 < 3
    assert ei.value.signum == signal.SIGINT


def test_run_async_outside_handling_is_plain_asyncio_run():
    async def answer() -> int:
        return 42

    assert interrupts.run_async(answer()) == 42
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_sigusr1_prints_every_threads_stack_and_the_run_goes_on():
    """`kill -USR1 <pid>` of a kvchaos process that seems hung says where each thread waits."""
    import subprocess
    import sys

    code = ("import threading, time\n"
            "from chaos import cli\n"
            "def stuck_in_a_worker(): time.sleep(60)\n"
            "def fake_app():\n"
            "    threading.Thread(target=stuck_in_a_worker, daemon=True).start()\n"
            "    print('ready', flush=True); time.sleep(2); print('went on', flush=True)\n"
            "cli.app = fake_app\n"
            "cli.main()\n")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        proc.send_signal(signal.SIGUSR1)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert "went on" in out
    assert "stuck_in_a_worker" in err and "fake_app" in err  # both threads' stacks
