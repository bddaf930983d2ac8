"""`kvchaos cleanup` undoes only runs whose runner is gone: a live run is skipped (and passes),
`--force RUN_ID` undoes it anyway, and what cleanup prints is what it did."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from chaos.cleanup import cleanup
from chaos.journal import Journal, all_journals, live_owner, open_entries, owner_alive, owner_record
from chaos.procid import boot_id, identity, same_process, start_ticks

REPO = Path(__file__).resolve().parents[2]

DATA = Path(__file__).parent / "data"


def _sleeper(group: bool = True) -> subprocess.Popen:
    return subprocess.Popen(["sleep", "300"], start_new_session=group)


def _journal_owned_by(directory: Path, run_id: str, owner: subprocess.Popen | None) -> Journal:
    """A journal whose owner line names ``owner`` (a live process standing in for a runner), or
    a process that is gone when ``owner`` is None."""
    path = directory / f"{run_id}.jsonl"
    directory.mkdir(parents=True, exist_ok=True)
    rec = owner_record()
    if owner is None:
        gone = subprocess.Popen(["true"])
        gone.wait()
        rec.update(pid=gone.pid, create_time=time.time() - 5, start_ticks=None)
    else:
        rec.update(pid=owner.pid, **identity(owner.pid))
    path.write_text(json.dumps(rec) + "\n")
    j = Journal(run_id, directory=directory)
    j._owner_pid = os.getpid()  # write entries as the stand-in runner's, without our own owner line
    return j


def _add_process(j: Journal, p: subprocess.Popen, service: str) -> None:
    j.add("process", f"{service}:{p.pid}", pid=p.pid, pgid=p.pid, create_time=psutil.Process(p.pid).create_time(),
          service=service)


def test_a_live_runner_is_skipped_and_force_undoes_it(tmp_path):
    runner, service = _sleeper(), _sleeper()
    try:
        j = _journal_owned_by(tmp_path / "journal", "live-run", runner)
        _add_process(j, service, "redis")
        rep = cleanup(tmp_path / "journal")
        assert rep.undone == [] and rep.errors == []
        assert len(rep.skipped) == 1 and f"pid {runner.pid}" in rep.skipped[0] and "live-run" in rep.skipped[0]
        assert service.poll() is None and j.path.exists()
        rep = cleanup(tmp_path / "journal", force=["live-run"])
        assert rep.undone == [f"ended process group {service.pid} (redis)"], rep
        assert service.wait(10) is not None and not j.path.exists()
        assert runner.poll() is None  # the runner itself is not cleanup's to end
        assert cleanup(tmp_path / "journal", force=["no-such-run"]).errors == [
            f"--force no-such-run: no journal of that run in {tmp_path / 'journal'}"]
    finally:
        for p in (runner, service):
            if p.poll() is None:
                p.kill()
                p.wait()


def test_a_journal_whose_runner_is_gone_is_undone(tmp_path):
    service = _sleeper()
    try:
        j = _journal_owned_by(tmp_path / "journal", "dead-run", None)
        _add_process(j, service, "engine")
        rep = cleanup(tmp_path / "journal")
        assert rep.skipped == [] and rep.undone == [f"ended process group {service.pid} (engine)"]
        assert service.wait(10) is not None and list(all_journals(tmp_path / "journal")) == []
    finally:
        if service.poll() is None:
            service.kill()


def test_a_paused_service_is_reported_as_resumed_then_ended(tmp_path):
    """The input that showed it: cleanup printed "ended process group N (?)" for the journal's
    ``paused`` entry of a service (the entry has no service field; its key does)."""
    service = _sleeper()
    try:
        j = _journal_owned_by(tmp_path / "journal", "dead-run", None)
        _add_process(j, service, "lmcache")
        os.killpg(service.pid, signal.SIGSTOP)
        j.add("paused", f"lmcache:{service.pid}", pgid=service.pid, pid=service.pid,
              create_time=psutil.Process(service.pid).create_time())
        rep = cleanup(tmp_path / "journal")
        assert rep.undone == [f"resumed paused service lmcache (process group {service.pid})",
                              f"ended process group {service.pid} (lmcache)"], rep
        assert not any("(?)" in line for line in rep.undone)
        assert service.wait(10) is not None
    finally:
        if service.poll() is None:
            service.kill()


def test_a_detached_stack_is_skipped_until_forced(tmp_path):
    service = _sleeper()
    try:
        j = _journal_owned_by(tmp_path / "journal", "stack-x", None)
        _add_process(j, service, "redis")
        stack_dir = tmp_path / "stacks" / "x"
        stack_dir.mkdir(parents=True)
        (stack_dir / "state.json").write_text(json.dumps({"journal": str(j.path), "stack_file": "/s/x.yml"}))
        rep = cleanup(tmp_path / "journal")
        assert rep.undone == [] and "stack /s/x.yml left up by `kvchaos stack up`" in rep.skipped[0]
        assert service.poll() is None
        assert cleanup(tmp_path / "journal", force=["stack-x"]).undone == [
            f"ended process group {service.pid} (redis)"]
    finally:
        if service.poll() is None:
            service.kill()


def test_every_writer_records_itself_as_owner(tmp_path):
    j = Journal("r", directory=tmp_path)
    j.add("mount", "/m", path="/m")
    j.remove("mount", "/m")
    owners = [json.loads(x) for x in j.path.read_text().splitlines() if '"owner"' in x]
    assert len(owners) == 1 and owners[0]["pid"] == os.getpid()
    assert owners[0]["start_ticks"] == start_ticks(os.getpid()) and owners[0]["boot_id"] == boot_id()
    assert owner_alive(owners[0])


def test_a_wall_clock_step_does_not_make_a_live_owner_dead(tmp_path):
    """The input that showed it (CI, 2026-12-02): this process's psutil create_time moved by
    89 s within one test (the host clock was stepped), so the owner line written earlier no
    longer matched and a live run would have been taken for a dead one."""
    j = Journal("r", directory=tmp_path)
    j.add("mount", "/m", path="/m")
    owner = next(json.loads(x) for x in j.path.read_text().splitlines() if '"owner"' in x)
    stepped = dict(owner, create_time=owner["create_time"] - 89.0)
    assert owner_alive(stepped) and live_owner(j.path) is not None
    # the same start in another boot, or another start, is another process
    assert not owner_alive(dict(stepped, boot_id="00000000-0000-0000-0000-000000000000"))
    assert not owner_alive(dict(owner, start_ticks=owner["start_ticks"] + 1))
    # a record from an older kvchaos (create_time only) is still compared by create_time
    old = {k: v for k, v in owner.items() if k not in ("start_ticks", "boot_id")}
    assert owner_alive(old) and not owner_alive(dict(old, create_time=old["create_time"] - 89.0))


def test_a_wall_clock_step_does_not_make_a_started_service_a_stranger(tmp_path):
    """cleanup ends the process group of a journal's process after the clock was stepped (the
    entry's create_time no longer matches psutil's), and leaves a reused pid alone."""
    service = _sleeper()
    try:
        j = _journal_owned_by(tmp_path / "journal", "run-x", None)
        j.add("process", f"redis:{service.pid}", pid=service.pid, pgid=service.pid,
              create_time=psutil.Process(service.pid).create_time() - 89.0, **{
                  k: v for k, v in identity(service.pid).items() if k != "create_time"}, service="redis")
        assert cleanup(tmp_path / "journal").undone == [f"ended process group {service.pid} (redis)"]
        assert service.wait(10) is not None
    finally:
        if service.poll() is None:
            service.kill()


def test_start_ticks_reads_past_a_command_name_with_spaces_and_parentheses(tmp_path):
    exe = tmp_path / "a) b (c"
    exe.symlink_to("/bin/sleep")
    p = subprocess.Popen([str(exe), "30"])
    try:
        ticks = start_ticks(p.pid)
        assert ticks is not None and ticks == int(Path(f"/proc/{p.pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
        assert ticks >= start_ticks(os.getpid())
        assert same_process(p.pid, identity(p.pid))
    finally:
        p.kill()
        p.wait()
    assert start_ticks(p.pid) is None and not same_process(p.pid, {"start_ticks": ticks, "boot_id": boot_id()})


@pytest.mark.slow
def test_cleanup_while_another_run_is_live_leaves_it_untouched_and_it_passes(tmp_path):
    """Acceptance: `kvchaos cleanup` during a live run (the input that showed it: it undid every
    open entry of every journal, and the live run's liveness check then failed)."""
    env = dict(os.environ, KVCHAOS_STATE_DIR=str(tmp_path / "state"))
    # the fault stays 20 s (not the kill-point tests' 4 s): `kvchaos cleanup` takes seconds to
    # start on a loaded host and must find the run still live
    scenario = tmp_path / "killpoint.yaml"
    shutil.copy(DATA / "killpoint-stack.yml", tmp_path / "killpoint-stack.yml")
    scenario.write_text((DATA / "killpoint.yaml").read_text().replace("duration: 4s", "duration: 20s"))
    run = subprocess.Popen([sys.executable, "-m", "chaos.cli", "run", str(scenario),
                            "--report-dir", str(tmp_path / "reports")], env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True)
    try:
        # a loaded CI host can take minutes to start the stack; a run that ended is not waited for
        deadline = time.monotonic() + 300
        fault_open = False
        while time.monotonic() < deadline and not fault_open and run.poll() is None:
            fault_open = any(e["kind"] == "fault" for j in all_journals(tmp_path / "state" / "journal")
                             for e in open_entries(j))
            time.sleep(0.1)
        assert fault_open, ("the run never applied its fault", run.poll(),
                            run.communicate(timeout=60)[0][-3000:] if run.poll() is not None else "")
        procs = [e for j in all_journals(tmp_path / "state" / "journal") for e in open_entries(j)
                 if e["kind"] == "process"]
        r = subprocess.run([sys.executable, "-m", "chaos.cli", "cleanup"], env=env, capture_output=True,
                           text=True, timeout=60)
        assert r.returncode == 0, r.stdout + r.stderr
        assert "skipped live run: pid " in r.stdout and "healed" not in r.stdout and "ended" not in r.stdout
        assert all(psutil.pid_exists(e["pid"]) for e in procs)
        out, _ = run.communicate(timeout=120)
    finally:
        if run.poll() is None:
            run.kill()
    assert run.returncode == 0, out
    result = json.loads(next((tmp_path / "reports").glob("killpoint-*/result.json")).read_text())
    assert result["verdict"] == "passed" and result["service_exits"] == []
    assert list(all_journals(tmp_path / "state" / "journal")) == []


def test_only_limits_cleanup_to_the_named_journals(tmp_path):
    """A campaign undoing what one dead worker left must not undo another dead run's journal."""
    mine, theirs = _sleeper(), _sleeper()
    try:
        _add_process(_journal_owned_by(tmp_path / "journal", "dead-worker", None), mine, "redis")
        _add_process(_journal_owned_by(tmp_path / "journal", "other-dead-run", None), theirs, "engine")
        rep = cleanup(tmp_path / "journal", force=["dead-worker"], only=["dead-worker"])
        assert rep.undone == [f"ended process group {mine.pid} (redis)"], rep
        assert mine.wait(10) is not None
        assert theirs.poll() is None and (tmp_path / "journal" / "other-dead-run.jsonl").exists()
    finally:
        for p in (mine, theirs):
            if p.poll() is None:
                p.kill()


def test_a_journal_written_again_after_close_names_its_live_owner(tmp_path):
    """A stack restarted by its pool (down: the journal closed, its file deleted; up: the same
    Journal writes again) must still name its runner: the new file once had no owner line, so
    `kvchaos cleanup` took the live runner for gone and tore its restarted stack down (seen on
    the 2-core host: a loaded catalogue run's stack, restarted after a disruptive scenario,
    lost its processes and its L2 mount to a cleanup run next to it)."""
    service = _sleeper()
    try:
        j = Journal("restarted-stack", directory=tmp_path / "journal")
        j.add("mount", "/x", path="/x")
        j.remove("mount", "/x")
        j.close()
        assert not j.path.exists()
        _add_process(j, service, "redis")  # the stack's next up()
        assert live_owner(j.path) is not None and live_owner(j.path)["pid"] == os.getpid()
        rep = cleanup(tmp_path / "journal")
        assert rep.undone == [] and len(rep.skipped) == 1, rep
        assert service.poll() is None and j.path.exists()
    finally:
        service.kill()
        service.wait()


#: A test run by an inner pytest session: a "kvchaos" process journals a service (a sleep in
#: its own process group, as a stack's service) and is then killed with SIGKILL, as a test kills
#: kvchaos at its timeout; the service's pid goes to $PIDFILE.
KILLED_RUNNER_TEST = '''
import os, subprocess, sys

CODE = ("import os, signal, subprocess; from chaos.journal import Journal; "
        "p = subprocess.Popen(['sleep', '300'], start_new_session=True, "
        "stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL); "
        "Journal('killed-run').add('process', f'sleep:{p.pid}', pid=p.pid, pgid=p.pid, service='sleep'); "
        "print(p.pid, flush=True); os.kill(os.getpid(), signal.SIGKILL)")


def test_a_runner_killed_with_its_service_up():
    out = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, timeout=60)
    open(os.environ["PIDFILE"], "w").write(out.stdout)
    assert out.returncode == -9 and out.stdout.strip()
'''


def test_the_test_session_undoes_what_a_killed_runner_left_in_its_state_folder(tmp_path):
    """Input that showed it: a test that killed its kvchaos subprocess at its timeout left the
    run's services up, journaled in the session's own state folder (tests/conftest.py), which no
    later `kvchaos cleanup` reads. The session's end now cleans that folder up and removes it."""
    (tmp_path / "test_inner.py").write_text(KILLED_RUNNER_TEST)
    pidfile = tmp_path / "pid"
    env = {k: v for k, v in os.environ.items() if k not in ("KVCHAOS_STATE_DIR", "PYTEST_ADDOPTS")}
    env.update(PIDFILE=str(pidfile), PYTHONPATH=str(REPO / "tests"))
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "conftest",
                        "--rootdir", str(tmp_path), str(tmp_path / "test_inner.py")],
                       capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    pid = int(pidfile.read_text())
    try:
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
        assert f"undone: ended process group {pid} (sleep)" in r.stdout, r.stdout[-3000:]
        deadline = time.monotonic() + 10
        while psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
            assert time.monotonic() < deadline, f"the killed runner's service {pid} still runs"
            time.sleep(0.1)
        made = [line for line in r.stdout.splitlines() if "kvchaos cleanup of the test state folder" in line]
        assert made and not Path(made[0].split("folder ")[1].split()[0]).exists()
    finally:
        try:
            os.killpg(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
