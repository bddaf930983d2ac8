"""`kvchaos run --jobs N` (chaos/campaign.py): scenarios in parallel on isolated stacks, real
processes and real stacks.

- the verdicts and exit code of --jobs 2 are those of the serial run (smoke's, passed, from
  the catalogue's serial run), with one suite report merging every worker's runs in the
  scenarios' order, and nothing left running;
- SIGTERM to the parent alone (``kill``) or to its process group (a terminal) mid-run: every
  run under way is reported ``interrupted``, exit 143, no process of the run remains;
- a worker killed mid-run: its scenario is an infrastructure error naming it, the other goes on;
- a bad file, or a bad --jobs, exits 2 with nothing started.

The quick scenarios run on a small stack (Redis behind the bundled proxy, no engine: seconds to
start); the comparison includes scenarios/smoke.yaml on the reference stack.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from chaos.campaign import default_jobs, parse_jobs
from chaos.journal import all_journals, open_entries
from chaos.procid import identity, same_process
from kvchaos_support import command_line, communicate_or_dump, default_sigint

REPO = Path(__file__).resolve().parents[2]
DATA = Path(__file__).parent / "data"
GiB = 2**30


def test_default_jobs_is_one_more_than_the_cores_within_the_memory():
    assert default_jobs(cpus=2, available_bytes=24 * GiB, stack_bytes=2 * GiB) == 3
    assert default_jobs(cpus=16, available_bytes=24 * GiB, stack_bytes=2 * GiB) == 9  # 0.75 * 24 / 2
    assert default_jobs(cpus=8, available_bytes=1 * GiB, stack_bytes=2 * GiB) == 1  # never below 1


def test_jobs_accepts_a_whole_number_or_auto():
    assert parse_jobs("3") == 3
    assert parse_jobs("auto") == default_jobs()
    for bad in ("0", "-1", "two", "1.5"):
        with pytest.raises(ValueError, match="--jobs must be"):
            parse_jobs(bad)


def _env(tmp_path: Path) -> dict[str, str]:
    """The defaults for every port (each stack claims its own), a state dir of the test's."""
    env = {k: v for k, v in os.environ.items() if not k.endswith("_PORT")}
    env["KVCHAOS_STATE_DIR"] = str(tmp_path / "state")
    return env


def _kvchaos(env, *args, **kw) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "chaos.cli", "run", *map(str, args)], env=env, cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kw)


@pytest.mark.parametrize("args", [["--jobs", "0"], ["--jobs", "many"], [DATA / "no-such.yaml", "--jobs", "2"]],
                         ids=["zero", "words", "missing-file"])
def test_bad_input_exits_2_with_nothing_started(tmp_path, monkeypatch, args):
    code, out = _run_in_process(tmp_path, monkeypatch, DATA / "hold-latency.yaml", *args)
    assert code == 2, out
    assert "error:" in out
    assert not (tmp_path / "reports").exists()  # no run, no suite, no stack folder
    assert not list(all_journals(tmp_path / "state" / "journal"))  # nothing was started


def test_a_bad_file_among_good_ones_exits_2_naming_its_line_with_jobs(tmp_path, monkeypatch):
    bad = tmp_path / "bad.yaml"
    bad.write_text((DATA / "hold-latency.yaml").read_text().replace("stack: proxy-redis.yml",
                                                                    f"stack: {DATA / 'proxy-redis.yml'}")
                   .replace("duration: 4s", "duration: soon"))
    code, out = _run_in_process(tmp_path, monkeypatch, DATA / "hold-latency.yaml", bad, "--jobs", "2")
    assert code == 2, out
    assert f"{bad}:" in out and "duration" in out, out
    assert not (tmp_path / "reports").exists()
    assert not list(all_journals(tmp_path / "state" / "journal"))


def _run_in_process(tmp_path: Path, monkeypatch, *args) -> tuple[int, str]:
    """`kvchaos run ARGS` in this process (typer's runner: stdout and stderr together)."""
    from typer.testing import CliRunner

    from chaos.cli import app

    monkeypatch.setenv("KVCHAOS_STATE_DIR", str(tmp_path / "state"))
    for name in ("KVCHAOS_DIAGNOSE", "KVCHAOS_DIAGNOSE_BUDGET_S", "KVCHAOS_PROXY"):
        monkeypatch.setenv(name, os.environ.get(name, ""))  # the command may set them: restored after
        if not os.environ[name]:
            monkeypatch.delenv(name)
    r = CliRunner().invoke(app, ["run", *map(str, args), "--report-dir", str(tmp_path / "reports")])
    return r.exit_code, r.output


def _results(reports: Path) -> dict[str, dict]:
    return {json.loads(f.read_text())["run_id"]: json.loads(f.read_text()) for f in reports.glob("*/result.json")}


def _suite(reports: Path) -> dict:
    (suite,) = reports.glob("suite-*/suite.json")
    return json.loads(suite.read_text())


@pytest.mark.slow
def test_jobs_2_gives_the_serial_verdicts_and_one_merged_suite_report(tmp_path):
    """The serial run is of the two scenarios on the small stack (seconds to start); smoke on
    the reference stack runs in the --jobs 2 run only, beside them on another worker, and must
    give what a serial run of it gives: passed, exit 0 (the catalogue's smoke in `make test`'s
    chaos stage, the serial runner; a reference stack start is about 50 CPU-seconds, so the
    serial run no longer starts one of its own)."""
    small = [DATA / "hold-latency.yaml", DATA / "idle-link.yaml"]
    env = _env(tmp_path)
    runs = {}
    for jobs, subset in (("1", small), ("2", [REPO / "scenarios" / "smoke.yaml", *small])):
        reports = tmp_path / f"reports-{jobs}"
        p = _kvchaos(env, *subset, "--jobs", jobs, "--report-dir", reports)
        out = communicate_or_dump(p, 900, env["KVCHAOS_STATE_DIR"])
        suite = _suite(reports)
        runs[jobs] = (p.returncode, [(r["scenario"], r["verdict"], r["exit_code"]) for r in suite["runs"]], out)
        # Every run's report folder, as a serial run writes it.
        for r in suite["runs"]:
            assert (reports / r["run_dir"] / "report.html").exists(), r
        assert set(_results(reports)) == {r["run_id"] for r in suite["runs"]}
        junit = next(reports.glob("suite-*/junit.xml")).read_text()
        assert junit.count("<testsuite ") == len(subset), junit
        # Once it is over: no journal entry left, so no process of a stack, no fault.
        left = {j.name: open_entries(j) for j in all_journals(tmp_path / "state" / "journal")}
        assert not any(left.values()), left
    serial, parallel = runs["1"], runs["2"]
    assert [s for s, _, _ in parallel[1]] == ["smoke", "hold-latency", "idle-link"]  # the scenarios' order
    assert parallel[1][1:] == serial[1], (serial, parallel[2][-3000:])
    assert parallel[1] == [("smoke", "passed", 0), ("hold-latency", "passed", 0), ("idle-link", "unknown", 4)], \
        parallel[2][-3000:]
    assert parallel[0] == serial[0] == 4
    # Progress lines name their scenario, so that the workers' interleaved lines stay readable.
    assert "[hold-latency] " in parallel[2] and "[smoke] " in parallel[2]


def _holding(tmp_path: Path, name: str, duration: str) -> Path:
    """hold-latency-long as ``name`` holding its toxic for ``duration``."""
    path = tmp_path / f"{name}.yaml"
    path.write_text((DATA / "hold-latency-long.yaml").read_text()
                    .replace("name: hold-latency-long", f"name: {name}")
                    .replace("stack: proxy-redis.yml", f"stack: {DATA / 'proxy-redis.yml'}")
                    .replace("duration: 60s", f"duration: {duration}"))
    return path


def _wait_until_applied(reports: Path, names: list[str], proc: subprocess.Popen, timeout_s: float = 240) -> None:
    """Until each named run's history has its toxic applied (an event, not a guess)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()[0][-3000:]
        done = set()
        for name in names:
            for h in reports.glob(f"{name}-*/history.jsonl"):
                ops = [json.loads(x) for x in h.read_text().splitlines() if x.strip().endswith("}")]
                if any(op.get("f") == "apply" and op.get("type") == "ok" for op in ops):
                    done.add(name)
        if done == set(names):
            return
        time.sleep(0.2)
    raise AssertionError(f"the faults of {names} were never applied")


def _tree(pid: int) -> list[tuple[int, dict]]:
    p = psutil.Process(pid)
    return [(q.pid, identity(q.pid)) for q in [p, *p.children(recursive=True)]]


def _alive(procs: list[tuple[int, dict]]) -> list[int]:
    out = []
    for pid, ident in procs:
        try:
            if same_process(pid, ident) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                out.append(pid)
        except psutil.NoSuchProcess:
            pass
    return out


@pytest.mark.slow
@pytest.mark.parametrize("to_group", [False, True], ids=["kill-parent", "kill-group"])
def test_sigterm_mid_run_reports_interrupted_exits_143_and_leaves_nothing(tmp_path, to_group):
    names = ["hold-a", "hold-b"]
    files = [_holding(tmp_path, n, "120s") for n in names]
    env = _env(tmp_path)
    reports = tmp_path / "reports"
    p = _kvchaos(env, *files, _holding(tmp_path, "hold-c", "1s"), "--jobs", "2", "--report-dir", reports,
                 start_new_session=True)  # its own group: killpg reaches it (and its group) only
    try:
        _wait_until_applied(reports, names, p)
        procs = _tree(p.pid)  # parent, workers, every service of both stacks
        assert len(procs) >= 2 + 2 * 3, procs
        if to_group:
            os.killpg(p.pid, signal.SIGTERM)
        else:
            p.send_signal(signal.SIGTERM)
        out = communicate_or_dump(p, 300, env["KVCHAOS_STATE_DIR"])
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 143, out[-3000:]
    suite = _suite(reports)
    assert (suite["verdict"], suite["exit_code"], suite["interrupted"]["signal"]) == ("interrupted", 143, "SIGTERM")
    verdicts = {r["scenario"]: r["verdict"] for r in suite["runs"]}
    assert verdicts == {"hold-a": "interrupted", "hold-b": "interrupted"}, verdicts  # hold-c never started
    for r in suite["runs"]:
        result = json.loads((reports / r["run_dir"] / "result.json").read_text())
        assert result["interrupted"]["signal"] == "SIGTERM", result["interrupted"]
        history = [json.loads(x) for x in (reports / r["run_dir"] / "history.jsonl").read_text().splitlines()]
        assert [op["fault_id"] for op in history if op["f"] == "heal" and op["type"] == "ok"] == ["slow-link"]
    assert _alive(procs) == [], [command_line(q) for q in _alive(procs)]
    assert not any(open_entries(j) for j in all_journals(tmp_path / "state" / "journal"))


@pytest.mark.slow
def test_sigint_to_the_group_while_the_stacks_start_reports_interrupted_and_leaves_nothing(tmp_path):
    """A terminal's Ctrl-C as the workers' stacks come up (their first process journalled)."""
    files = [_holding(tmp_path, n, "60s") for n in ("hold-a", "hold-b")]
    env = _env(tmp_path)
    reports = tmp_path / "reports"
    journal = tmp_path / "state" / "journal"
    p = _kvchaos(env, *files, "--jobs", "2", "--report-dir", reports, start_new_session=True,
                 preexec_fn=default_sigint)  # a shell's background job ignores SIGINT
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:  # both workers have started a process of their stack
            owners = {o.get("pid") for j in all_journals(journal) for o in _owners(j)
                      if any(e["kind"] == "process" for e in open_entries(j))}
            if len(owners) >= 2:
                break
            assert p.poll() is None, p.communicate()[0][-3000:]
            time.sleep(0.05)
        procs = _tree(p.pid)
        os.killpg(p.pid, signal.SIGINT)
        out = communicate_or_dump(p, 300, env["KVCHAOS_STATE_DIR"])
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 130, out[-3000:]
    suite = _suite(reports)
    assert {r["scenario"]: r["verdict"] for r in suite["runs"]} == {"hold-a": "interrupted", "hold-b": "interrupted"}
    assert suite["interrupted"]["signal"] == "SIGINT"
    for r in suite["runs"]:
        assert (reports / r["run_dir"] / "report.html").exists()
    assert _alive(procs) == [], [command_line(q) for q in _alive(procs)]
    assert not any(open_entries(j) for j in all_journals(journal))


def _two_holding(tmp_path: Path, durations: tuple[str, str]) -> tuple[subprocess.Popen, Path, list]:
    """`kvchaos run hold-a hold-b --jobs 2` (its own session), once both toxics are in place:
    (the runner, its report folder, its process tree then, parent first)."""
    files = [_holding(tmp_path, n, d) for n, d in zip(("hold-a", "hold-b"), durations)]
    reports = tmp_path / "reports"
    p = _kvchaos(_env(tmp_path), *files, "--jobs", "2", "--report-dir", reports, start_new_session=True)
    try:
        _wait_until_applied(reports, ["hold-a", "hold-b"], p)
        return p, reports, _tree(p.pid)
    except BaseException:
        p.kill()
        raise


def _workers(procs: list[tuple[int, dict]]) -> list[psutil.Process]:
    return [psutil.Process(pid) for pid, _ in procs[1:] if "chaos.campaign" in command_line(pid)]


@pytest.mark.slow
def test_sigkill_of_the_parent_leaves_no_worker_and_no_stack_without_any_cleanup(tmp_path):
    """The kernel's SIGTERM on the parent's death (PR_SET_PDEATHSIG): each worker heals, reports
    ``interrupted`` and brings its stack down by itself; no `kvchaos cleanup` is run."""
    p, reports, procs = _two_holding(tmp_path, ("120s", "120s"))
    try:
        workers = _workers(procs)
        assert len(workers) == 2
        p.kill()
        p.wait(30)
        _, alive = psutil.wait_procs(workers, timeout=240)  # not our children: no exit code
        assert not alive, [w.pid for w in alive]
    finally:
        if p.poll() is None:
            p.kill()
    for run in reports.glob("hold-*/result.json"):
        result = json.loads(run.read_text())
        assert (result["verdict"], result["interrupted"]["signal"]) == ("interrupted", "SIGTERM"), result
    assert len(list(reports.glob("hold-*/result.json"))) == 2
    assert _alive(procs) == [], [command_line(q) for q in _alive(procs)]
    assert not any(open_entries(j) for j in all_journals(tmp_path / "state" / "journal"))


@pytest.mark.slow
def test_a_worker_killed_mid_run_gives_its_scenario_an_infrastructure_error_and_the_others_go_on(tmp_path):
    p, reports, procs = _two_holding(tmp_path, ("120s", "15s"))
    env = {"KVCHAOS_STATE_DIR": str(tmp_path / "state")}
    try:
        run_a = next(reports.glob("hold-a-*"))
        # The worker running hold-a: the one whose stack's journal names hold-a's run.
        workers = _workers(procs)
        assert len(workers) == 2
        (victim,) = [w for w in workers
                     if any(run_a.name in j.name and any(o.get("pid") == w.pid for o in _owners(j))
                            for j in all_journals(tmp_path / "state" / "journal"))]
        victim.kill()
        out = communicate_or_dump(p, 300, env["KVCHAOS_STATE_DIR"])
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 3, out[-3000:]
    runs = {r["scenario"]: r for r in _suite(reports)["runs"]}
    assert runs["hold-b"]["verdict"] == "passed", runs
    assert runs["hold-a"]["exit_code"] == 3, runs
    assert f"pid {victim.pid}) died during this run (killed by SIGKILL)" in runs["hold-a"]["summary"], runs
    # What the dead worker's journals held (its stack, its toxic) was undone; nothing remains.
    assert _alive(procs) == [], [command_line(q) for q in _alive(procs)]
    assert not any(open_entries(j) for j in all_journals(tmp_path / "state" / "journal"))


def _owners(journal: Path) -> list[dict]:
    from chaos.journal import owners

    return owners(journal)
