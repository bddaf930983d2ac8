"""StackPool: a stack that did not come up is not handed to the next scenario; whatever fails
while a stack is built is an infrastructure error (a StackError, a report, exit 3); the port
variables a stack was given are claimed for it, and the pool's own rebuilds never refuse them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest

from chaos.runner.stacks import StackPool
from chaos.stack import ports
from chaos.stack.base import StackError
from chaos.stack.spec import free_port


def starts_once_allowed(tmp_path, marker):
    """A stack file (``tmp_path/stack.yml``) whose service exits 3 until ``marker`` exists."""
    stack_file = tmp_path / "stack.yml"
    stack_file.write_text(textwrap.dedent(f"""
        services:
          web:
            command: [python, -c, "import os, sys, http.server; os.path.exists({str(marker)!r}) or sys.exit(3); http.server.test(HandlerClass=http.server.SimpleHTTPRequestHandler, port=${{WEB_PORT:-0}}, bind='127.0.0.1')"]
            healthcheck:
              test: [CMD, kvchaos, probe, "http://127.0.0.1:${{WEB_PORT:-0}}/"]
              interval: 100ms
              retries: 100
    """))
    return stack_file


def test_a_stack_whose_up_failed_is_started_afresh_for_the_next_scenario(tmp_path):
    """Seen under --backend compose on a shared host: the first scenario's stack lost a port
    (exit 3, right), and the second scenario ran on that never-started stack and got a failed
    liveness check (20/20 requests: connection refused): a check verdict for an infrastructure
    error."""
    marker = tmp_path / "may-start"
    stack_file = starts_once_allowed(tmp_path, marker)
    pool = StackPool("local", tmp_path / "stacks")
    try:
        with pytest.raises(StackError):
            pool.acquire(stack_file)
        marker.touch()
        stack = pool.acquire(stack_file)  # a new stack, started: not the one that failed
        assert stack.status()["web"].state == "running"
    finally:
        pool.close()


def test_any_error_while_a_stack_is_built_is_a_stack_error(tmp_path, monkeypatch):
    """pick_port's OSError (and any other exception but a ConfigError) used to escape the pool:
    a traceback and no report, instead of an infrastructure error."""
    def no_port(*_a, **_k):
        raise OSError("could not find a free port to claim")

    monkeypatch.setattr(ports, "pick_port", no_port)
    stack_file = starts_once_allowed(tmp_path, tmp_path / "may-start")
    pool = StackPool("local", tmp_path / "stacks")
    try:
        with pytest.raises(StackError, match="OSError: could not find a free port to claim"):
            pool.acquire(stack_file)
    finally:
        pool.close()


def test_a_failure_to_claim_ports_ends_the_run_as_an_infrastructure_error_with_its_report(tmp_path):
    """E.g. a claims folder that cannot be made: exit 3, the report written, no traceback."""
    (tmp_path / "a-file").write_text("")
    env = dict(os.environ, KVCHAOS_STATE_DIR=str(tmp_path / "state"),
               KVCHAOS_PORT_CLAIMS_DIR=str(tmp_path / "a-file" / "claims"))
    scenario = Path(__file__).parent / "data" / "hold-latency.yaml"
    r = subprocess.run([sys.executable, "-m", "chaos.cli", "run", str(scenario), "--report-dir", str(tmp_path / "r")],
                       env=env, capture_output=True, text=True, timeout=300)
    out = r.stdout + r.stderr
    assert r.returncode == 3 and "Traceback" not in out, out[-3000:]
    (run,) = [d for d in (tmp_path / "r").iterdir() if d.name.startswith("hold-latency")]
    result = json.loads((run / "result.json").read_text())
    assert result["verdict"] == "unknown" and "a-file/claims" in result["error"], result["error"]
    assert (run / "report.html").exists()


def test_a_pool_never_refuses_its_own_ports(tmp_path, monkeypatch):
    """A port variable the user set is claimed for the stack; the pool's own rebuilds of that stack
    (a restart after a disruptive scenario, a fresh stack after one that did not start) reuse it,
    and only another stack is refused it."""

    port = free_port()
    monkeypatch.setenv("WEB_PORT", str(port))
    marker = tmp_path / "may-start"
    stack_file = starts_once_allowed(tmp_path, marker)
    pool = StackPool("local", tmp_path / "stacks")
    other = StackPool("local", tmp_path / "other")
    try:
        with pytest.raises(StackError):
            pool.acquire(stack_file)  # did not start: forgotten, its claims dropped
        marker.touch()
        stack = pool.acquire(stack_file)
        assert stack.env["WEB_PORT"] == str(port) and stack.status()["web"].state == "running"
        pool.release(stack_file, SimpleNamespace(faults=[], checks=[], error="a disruptive scenario"))
        assert pool.acquire(stack_file) is stack  # restarted on its own claims
        assert stack.status()["web"].state == "running"
        with pytest.raises(StackError, match=rf"WEB_PORT={port}: .*claimed by another kvchaos stack"):
            other.acquire(stack_file)
        pool.close()  # its stacks down, their claims dropped: a later pool may set the port
        assert other.acquire(stack_file).env["WEB_PORT"] == str(port)
    finally:
        other.close()
        pool.close()


def test_a_scenario_that_served_wrong_outputs_gets_the_next_one_a_fresh_engine(tmp_path):
    """Wrong KV an engine loaded stays in its freed blocks (the input: on vLLM CPU, after
    l2-bitflip-served-as-kv failed recompute_equivalence, two cold misses of the next scenario on
    the same stack generated token 0 from their fifth token): a failed recompute_equivalence
    marks the stack's engine for a restart; a passed one, or any other failed check, does not."""
    marker = tmp_path / "may-start"
    marker.touch()
    stack_file = starts_once_allowed(tmp_path, marker)
    pool = StackPool("local", tmp_path / "stacks")

    def ended(**verdicts: str) -> SimpleNamespace:
        return SimpleNamespace(faults=[], error=None,
                               checks=[SimpleNamespace(name=n, verdict=v) for n, v in verdicts.items()])

    try:
        pool.acquire(stack_file)
        pool.release(stack_file, ended(recompute_equivalence="passed", liveness="failed"))
        assert not pool._dirty
        pool.release(stack_file, ended(recompute_equivalence="failed", leaks="passed"))
        assert not pool._dirty and pool._engine_dirty == {stack_file.resolve()}
    finally:
        pool.close()


def test_after_wrong_outputs_the_next_scenario_gets_the_engine_restarted_and_the_rest_kept(tmp_path):
    """Wrong outputs alone (no disruptive fault, no leak, no error) restart the stack's engine,
    where the wrong KV stays, and nothing else: a whole stack restart cost every caught bug the
    start of the twin, both LMCache servers, Redis and the proxy. A passing run restarts nothing."""
    stack_file = tmp_path / "stack.yml"
    sleeper = '[python, -c, "import time; time.sleep(600)"]'
    stack_file.write_text(textwrap.dedent(f"""
        x-kvchaos:
          engine: engine
        services:
          engine:
            command: {sleeper}
          store:
            command: {sleeper}
    """))
    pool = StackPool("local", tmp_path / "stacks")

    def ended(**verdicts: str) -> SimpleNamespace:
        return SimpleNamespace(faults=[], error=None,
                               checks=[SimpleNamespace(name=n, verdict=v) for n, v in verdicts.items()])

    def pids(stack) -> dict[str, int | None]:
        return {name: st.pid for name, st in stack.status().items()}

    try:
        stack = pool.acquire(stack_file)
        first = pids(stack)
        pool.release(stack_file, ended(recompute_equivalence="failed", leaks="passed"))
        assert pool.acquire(stack_file) is stack
        second = pids(stack)
        assert second["engine"] != first["engine"] and second["store"] == first["store"], (first, second)
        assert stack.status()["engine"].state == "running"
        pool.release(stack_file, ended(recompute_equivalence="passed"))
        assert pool.acquire(stack_file) is stack and pids(stack) == second
    finally:
        pool.close()


def test_a_variable_whose_restart_failed_is_unset_for_the_next_scenario(tmp_path):
    """Input that showed it: `kvchaos explore --stack compose/vllm-cpu.yml --seed 4101` (2026-12-07):
    run 11 set ENGINE_NUM_BLOCKS=133, vLLM refused it at start-up (the KV pool held 2080 tokens,
    the max model length asked 2096) and the run was an infrastructure error, right; run 12 set no
    variable, yet its restart started vLLM with ENGINE_NUM_BLOCKS=133 again and failed the same
    way: the pool had not recorded the variable, whose restart raised, so it never unset it."""
    stack_file = tmp_path / "stack.yml"
    stack_file.write_text(textwrap.dedent("""
        services:
          web:
            command: [python, -c, "import sys, http.server; '${BAD:-}' and sys.exit(3); http.server.test(HandlerClass=http.server.SimpleHTTPRequestHandler, port=${WEB_PORT:-0}, bind='127.0.0.1')"]
            healthcheck:
              test: [CMD, kvchaos, probe, "http://127.0.0.1:${WEB_PORT:-0}/"]
              interval: 100ms
              retries: 100
    """))
    pool = StackPool("local", tmp_path / "stacks")
    try:
        assert pool.acquire(stack_file).status()["web"].state == "running"
        with pytest.raises(StackError, match="exited"):
            pool.acquire(stack_file, {"BAD": "1"})
        stack = pool.acquire(stack_file)  # no variable: the default again
        assert stack.status()["web"].state == "running"
        assert stack.env.get("BAD", "") == ""
    finally:
        pool.close()


def oracle_stack(tmp_path, twin_depends: str = "witness") -> Path:
    """A stack file of sleepers shaped like compose/reference.yml: an engine on an LMCache, and
    the recompute oracle beside them (the twin on its witness, or on ``twin_depends``)."""
    stack_file = tmp_path / "stack.yml"
    sleeper = 'command: [python, -c, "import time; time.sleep(600)"], healthcheck: {test: [CMD, "true"], interval: 100ms}'
    stack_file.write_text(textwrap.dedent(f"""
        x-kvchaos:
          engine: engine
          recompute: twin
          witness: {{service: witness, url: "tcp://127.0.0.1:1"}}
        services:
          lmcache: {{{sleeper}}}
          engine: {{{sleeper}, depends_on: [lmcache]}}
          witness: {{{sleeper}}}
          twin: {{{sleeper}, depends_on: {{{twin_depends}: {{condition: service_healthy}}}}}}
    """))
    return stack_file


def _ended(*faults: dict, error: str | None = None) -> SimpleNamespace:
    return SimpleNamespace(faults=[SimpleNamespace(kind=f["kind"], params=f) for f in faults], error=error,
                           checks=[SimpleNamespace(name="leaks", verdict="passed")])


def _pids(stack) -> dict[str, int | None]:
    return {name: st.pid for name, st in stack.status().items()}


def test_a_disrupted_stack_restarts_all_but_its_recompute_oracle(tmp_path):
    """After a scenario that killed LMCache the pool brought the whole stack down and up: the
    twin (a model load) and its witness LMCache started again for every disruptive scenario of
    the catalogue, though no fault touches them. Now everything else restarts, and they stay."""
    stack_file = oracle_stack(tmp_path)
    pool = StackPool("local", tmp_path / "stacks")
    try:
        stack = pool.acquire(stack_file)
        first = _pids(stack)
        stack.kill("lmcache")
        stack.start("lmcache")
        pool.release(stack_file, _ended({"kind": "kill", "service": "lmcache"}))
        assert pool.acquire(stack_file) is stack
        second = _pids(stack)
        assert {n for n in first if first[n] != second[n]} == {"lmcache", "engine"}, (first, second)
        assert all(st.state == "running" for st in stack.status().values())
    finally:
        pool.close()


@pytest.mark.parametrize("why", ["a fault named the twin", "the run ended in an error",
                                 "the twin rests on a restarted service"])
def test_a_disrupted_stack_restarts_its_recompute_oracle_too_when_it_may_be_touched(tmp_path, why):
    """An oracle service stays up only where nothing can have reached it: a fault that names the
    twin, or a twin whose health check depends on a service that restarts, restart the twin too;
    a run that ended in an error (a hung twin is not seen as exited) brings the whole stack down
    and up as before."""
    stack_file = oracle_stack(tmp_path, twin_depends="lmcache" if "rests" in why else "witness")
    pool = StackPool("local", tmp_path / "stacks")
    faults = [{"kind": "pause", "service": "twin" if "named" in why else "lmcache"}]
    try:
        stack = pool.acquire(stack_file)
        first = _pids(stack)
        pool.release(stack_file, _ended(*faults, error="scenario deadline of 60s passed" if "error" in why else None))
        assert pool.acquire(stack_file) is stack
        second = _pids(stack)
        assert second["twin"] != first["twin"] and second["engine"] != first["engine"], (first, second)
        if "error" in why:
            assert second["witness"] != first["witness"]
        else:
            assert second["witness"] == first["witness"]  # kept: nothing named it, it rests on nothing
    finally:
        pool.close()


def test_keep_only_none_brings_every_stack_down_and_the_pool_starts_afresh_after(tmp_path):
    """tests/conftest.py's session pool brings its stacks down between runs of its files with
    ``keep_only(None)`` (it used a stack-file path that could not exist for that)."""
    marker = tmp_path / "may-start"
    marker.touch()
    stack_file = starts_once_allowed(tmp_path, marker)
    pool = StackPool("local", tmp_path / "stacks")
    try:
        first = pool.acquire(stack_file)
        assert pool.keep_only(None) == [stack_file.resolve()]
        assert first.status()["web"].state != "running"
        again = pool.acquire(stack_file)
        assert again is not first and again.status()["web"].state == "running"
    finally:
        pool.close()
