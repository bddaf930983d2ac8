"""The longest-file-first order of ``make test``'s non-chaos stage (tests/file_durations.py and
its hook in tests/conftest.py)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from file_durations import TABLE, junit_test_seconds, load_table, merge_table, order_by_duration, simulate

REPO = Path(__file__).resolve().parents[1]


def test_files_go_longest_first_and_keep_their_own_tests_in_order():
    ids = ["a.py::t1", "b.py::t1", "a.py::t2", "c.py::t1", "b.py::t2", "d.py::t1"]
    seconds = {"a.py": 10.0, "b.py": 300.0, "c.py": 40.0}  # d.py unlisted: first, it may be long
    assert order_by_duration(ids, seconds) == ["d.py::t1", "b.py::t1", "b.py::t2", "c.py::t1", "a.py::t1", "a.py::t2"]


def test_without_a_table_the_order_is_left_as_it_is():
    ids = ["b.py::t1", "a.py::t1", "b.py::t2"]
    assert order_by_duration(ids, {}) == ["b.py::t1", "b.py::t2", "a.py::t1"]  # grouped, first seen first


def test_a_long_file_handed_out_last_is_a_tail_that_longest_first_removes():
    units = [("many.py", [1.0] * 30), ("short.py", [5.0]), ("long.py", [25.0] * 4)]
    assert simulate(units, 2) == 105.0  # long.py starts after short.py on the second worker
    seconds = {"many.py": 30.0, "short.py": 5.0, "long.py": 100.0}
    assert simulate(order_by_duration(units, seconds, key=lambda u: u[0]), 2) == 100.0


def test_simulate_gives_a_worker_its_next_file_when_two_tests_are_left():
    units = [("x.py", [1.0] * 4), ("y.py", [1.0, 10.0, 10.0]), ("z.py", [20.0])]
    assert simulate(units, 1) == 45.0
    # y.py's worker has two tests left at t=1 and takes z.py then, though x.py's is free at t=4.
    assert simulate(units, 2) == 41.0


def test_the_table_is_read_from_a_junit_xml(tmp_path):
    (tmp_path / "tests" / "a").mkdir(parents=True)
    (tmp_path / "tests" / "a" / "test_b.py").write_text("")
    xml = tmp_path / "junit.xml"
    xml.write_text(
        '<testsuites><testsuite name="pytest">'
        '<testcase classname="tests.a.test_b" name="test_one" time="1.5"/>'
        '<testcase classname="tests.a.test_b.TestC" name="test_two[x]" time="2.25"/>'
        '<testcase classname="" name="tests.compose" time="0.000"><skipped message="collection skipped"/></testcase>'
        "</testsuite></testsuites>"
    )
    assert junit_test_seconds(xml, tmp_path) == {"tests/a/test_b.py": [1.5, 2.25]}


def test_a_new_run_updates_the_table_and_keeps_what_it_skipped(tmp_path):
    for name in ("kept.py", "timed.py"):
        (tmp_path / name).write_text("")
    old = {"kept.py": 200.0, "timed.py": 50.0, "deleted.py": 9.0}
    assert merge_table(old, {"timed.py": 60.0}, tmp_path) == {"kept.py": 200.0, "timed.py": 60.0}


def test_a_broken_table_is_an_error_naming_the_file(tmp_path):
    bad = tmp_path / "file_durations.json"
    bad.write_text('{"tests/a.py": "slow"}')
    with pytest.raises(ValueError, match="file_durations.json: expected a JSON object"):
        load_table(bad)
    assert load_table(tmp_path / "missing.json") is None


def test_the_repo_table_orders_an_xdist_loadfile_run():
    """On an xdist worker (whose own ``dist`` option xdist sets to "no"): one worker runs the
    files in the queue's order, which must be the table's, longest first.

    A whole pytest session (a controller and a worker, each importing pytest, its plugins and
    kvchaos): tests/report alone, seven files of about a second in all, and without hypothesis's
    plugin, which none of them uses (about 1.5 CPU-seconds of imports per process)."""
    table = load_table(TABLE)
    assert table, f"{TABLE} is missing or empty: make record-durations"
    dirs = ["tests/report"]
    out = subprocess.run([sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider", "-p", "no:hypothesispytest",
                          "-n", "1", "--dist", "loadfile", "--no-loadscope-reorder", *dirs],
                         cwd=REPO, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    ran = list(dict.fromkeys(re.findall(r"(tests/\S+\.py)::", "\n".join(
        line for line in out.stdout.splitlines() if line.startswith("[gw0]")))))
    times = [table[f] for f in ran if f in table]
    assert len(times) >= 5 and times[0] == max(times) > min(times)
    assert times == sorted(times, reverse=True), list(zip(ran, times))


def test_the_reference_pool_files_are_one_unit_of_work_and_every_user_of_the_pool_is_one():
    """tests/conftest.py's scheduler gives every file of REFERENCE_POOL_FILES one scope (one
    worker runs them in a row, sharing the session's reference_pool); a file that asks for
    ``reference_pool`` but is not listed would still pass, starting a stack of its own in
    whichever worker runs it, so the list is checked against the files that use it."""
    from file_durations import REFERENCE_POOL_FILES, REFERENCE_POOL_SCOPE, scope_of

    repo = Path(__file__).resolve().parents[1]
    assert all((repo / f).is_file() for f in REFERENCE_POOL_FILES), sorted(REFERENCE_POOL_FILES)
    assert {scope_of(f"{f}::test_x[a]") for f in REFERENCE_POOL_FILES} == {REFERENCE_POOL_SCOPE}
    assert scope_of("tests/faults/test_network.py::test_x") == "tests/faults/test_network.py"
    users = {str(p.relative_to(repo)) for p in (repo / "tests").rglob("test_*.py")
             if "reference_pool" in p.read_text() and p.name != "test_file_durations.py"}
    faults_pool = {str(p.relative_to(repo)) for p in (repo / "tests" / "faults").glob("test_*.py")
                   if "(pool," in p.read_text()}  # tests/faults/conftest.py's pool is reference_pool
    assert users | faults_pool <= REFERENCE_POOL_FILES, sorted((users | faults_pool) - REFERENCE_POOL_FILES)
