"""Stack capabilities: what a stack declares and implies, what scenarios need, and the errors
(file:line, exit 2) for what a stack lacks, before anything starts."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from typer.testing import CliRunner

from chaos.faults.base import Fault, FaultParams
from chaos.faults.registry import register
from chaos.scenario.cli import app
from chaos.scenario.loader import check_scenario, load_scenario, validate_against_stack
from chaos.scenario.needs import missing, need_met, scenario_needs
from chaos.stack.capabilities import CAPABILITIES, DERIVED, is_known
from chaos.stack.spec import load_stack
from chaos.yamlsource import ConfigError

REPO = Path(__file__).resolve().parents[2]

runner = CliRunner()

BARE = """\
services:
  engine: {command: [sleep, "1"]}
  lmcache: {command: [sleep, "1"]}
x-kvchaos:
  engine: engine
  engine_url: http://127.0.0.1:${ENGINE_PORT:-18100}
  recompute_url: http://127.0.0.1:${RECOMPUTE_PORT:-18101}
  leak_sources:
    - {name: lmcache, url: "http://127.0.0.1:1/status", fields: {s: active_sessions}}
"""

SCENARIO = """\
name: needs-things
stack: stack.yml
variables: {ENGINE_NUM_BLOCKS: "100"}
engine: {prefix_caching: true}
workload: {tenants: 2, requests: 2}
phases:
  - name: warm
  - name: hit
    faults:
      - {kind: preempt, name: p, start: 0s, duration: 1s}
      - kind: hook
        name: stall
        service: engine
        needs: [engine.hooks.stall]
        apply: {http: {url: "http://127.0.0.1:${ENGINE_PORT}/hooks/stall"}}
        duration: 1s
checks:
  recompute_equivalence: {mode: tolerant}
  hit_recovery: {phases: [hit]}
  leaks: {}
"""


def _write(tmp_path: Path, stack: str, scenario: str = SCENARIO) -> Path:
    (tmp_path / "stack.yml").write_text(stack)
    path = tmp_path / "s.yaml"
    path.write_text(textwrap.dedent(scenario))
    return path


def test_every_missing_capability_is_an_error_at_its_line(tmp_path: Path) -> None:
    path = _write(tmp_path, BARE)
    scenario = load_scenario(path)
    spec = load_stack(tmp_path / "stack.yml", allocate_ports=False, require_commands=False)
    with pytest.raises(ConfigError) as err:
        validate_against_stack(scenario, set(), set(spec.services), capabilities=spec.capabilities(),
                               stack_name="stack.yml")
    text = "\n".join(err.value.problems)
    for line, what in [(10, "fault 'p' (preempt) needs engine.hooks.preempt"),
                       (10, "fault 'p' (preempt) needs engine.metrics"),
                       (11, "fault 'stall' (hook) needs engine.hooks.stall"),
                       (18, "check recompute_equivalence needs engine.logprobs"),
                       (19, "check hit_recovery needs engine.cache_stats"),
                       (3, "variable ENGINE_NUM_BLOCKS needs var:ENGINE_NUM_BLOCKS"),
                       (4, "engine.prefix_caching needs var:KVCHAOS_ENGINE_PREFIX_CACHING"),
                       (5, "workload.tenants > 1 needs engine.cache_salt")]:
        assert f"s.yaml:{line}: " in text and what in text, (what, text)
    assert "stack.yml does not offer it" in text
    assert "check leaks" not in text  # the stack has a leak source


def test_a_stack_that_offers_everything_passes(tmp_path: Path) -> None:
    stack = BARE + textwrap.indent(textwrap.dedent("""\
        capabilities: [engine.metrics, engine.hooks.preempt, engine.hooks.stall, engine.logprobs,
                       engine.cache_stats, engine.cache_salt]
        """), "  ")
    stack = stack.replace("leak_sources:", "leak_sources:", 1)
    stack += ('  # read by the engine\n'
              'x-vars: ["${ENGINE_NUM_BLOCKS:-1}", "${KVCHAOS_ENGINE_PREFIX_CACHING:-x}"]\n')
    path = _write(tmp_path, stack)
    r = runner.invoke(app, ["validate", str(path)])
    assert r.exit_code == 0, r.output


def test_validate_and_list_with_stack_exit_2_naming_the_capability(tmp_path: Path) -> None:
    path = _write(tmp_path, BARE)
    other = tmp_path / "other.yml"
    other.write_text(BARE.replace("18100", "18200"))
    r = runner.invoke(app, ["validate", str(path), "--stack", str(other)])
    assert r.exit_code == 2 and "engine.hooks.stall" in r.stderr and f"{other} does not offer it" in r.stderr
    r = runner.invoke(app, ["list", str(tmp_path), "--stack", str(other)])
    assert r.exit_code == 2 and "needs engine.hooks.preempt (fault 'p' (preempt))" in r.stdout
    assert "0 of 1 scenarios run on" in r.stdout


def test_unknown_or_derived_capability_in_a_stack_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "a.yml").write_text(BARE + "  capabilities: [engine.hooks.stal]\n")
    with pytest.raises(ConfigError, match=r"capabilities: item 0: unknown capability; known: ") as info:
        load_stack(tmp_path / "a.yml", allocate_ports=False, require_commands=False)
    assert "stal" not in str(info.value).replace("engine.hooks.stall", "")  # the file's value is not quoted
    (tmp_path / "b.yml").write_text(BARE + "  capabilities: [lmcache.http]\n")
    with pytest.raises(ConfigError, match="set x-kvchaos.lmcache_http instead"):
        load_stack(tmp_path / "b.yml", allocate_ports=False, require_commands=False)


def test_derived_and_variable_capabilities(tmp_path: Path) -> None:
    (tmp_path / "s.yml").write_text(BARE + "  lmcache_http: http://127.0.0.1:${LMCACHE_HTTP_PORT:-1}\n"
                                    "  redis: {service: lmcache, url: 'redis://127.0.0.1:1'}\n")
    caps = load_stack(tmp_path / "s.yml", allocate_ports=False, require_commands=False).capabilities()
    assert {"lmcache.http", "l2.redis", "recompute", "leak_sources", "var:ENGINE_PORT"} <= caps
    assert "l2.fs" not in caps and "var:KVCHAOS_RUN_DIR" not in caps


def test_either_of_two_capabilities():
    assert need_met("l2.fs|l2.redis", {"l2.redis"}) and not need_met("l2.fs|l2.redis", {"l2.fsx"})


def test_l2_corrupt_needs_the_tier_it_targets(tmp_path: Path) -> None:
    scenario = SCENARIO.replace(
        "      - {kind: preempt, name: p, start: 0s, duration: 1s}\n",
        "      - {kind: l2_corrupt, name: c, mode: delete, target: fs, duration: 1s}\n"
        "      - {kind: l2_corrupt, name: d, mode: delete, duration: 1s}\n")
    needs = {(n.who, n.capability) for n in scenario_needs(load_scenario(_write(tmp_path, BARE, scenario)))}
    assert ("fault 'c' (l2_corrupt)", "l2.fs") in needs
    assert ("fault 'd' (l2_corrupt)", "l2.fs|l2.redis") in needs


def test_every_registered_need_is_a_known_capability():
    from chaos.checks import registry as checks
    from chaos.faults import registry as faults

    for kind in faults.kinds():
        assert all(is_known(n) for need in faults.get(kind).needs for n in need.split("|")), kind
    for name in checks.names():
        assert all(is_known(n) for need in checks.get(name).needs for n in need.split("|")), name
    assert set(DERIVED) <= set(CAPABILITIES)


def test_a_new_fault_kind_with_an_unknown_need_is_refused_at_registration():
    from typing import Literal

    class OddParams(FaultParams):
        kind: Literal["odd_test_kind"]

    class Odd(Fault):
        params_model = OddParams
        needs = ("engine.teleport",)

        def apply(self, ctx):  # pragma: no cover - never built
            return {}

        def heal(self, ctx):  # pragma: no cover
            return {}

        def evidence(self, ctx):  # pragma: no cover
            return {}

    with pytest.raises(TypeError, match="unknown capabilities \\['engine.teleport'\\]"):
        register("odd_test_kind")(Odd)


def test_hook_needs_are_checked_when_the_scenario_loads(tmp_path: Path) -> None:
    path = _write(tmp_path, BARE, SCENARIO.replace("needs: [engine.hooks.stall]", "needs: [engine.hooks.stal]"))
    with pytest.raises(ConfigError, match="unknown capabilities \\['engine.hooks.stal'\\]"):
        load_scenario(path)


def test_missing_keeps_file_order(tmp_path: Path) -> None:
    scenario = load_scenario(_write(tmp_path, BARE))
    got = [n.capability for n in missing(scenario_needs(scenario), set())]
    assert got[0] == "engine.hooks.preempt" and got.index("engine.logprobs") > got.index("engine.hooks.stall")


def test_a_trigger_on_the_reference_engines_own_counters_needs_them(tmp_path: Path) -> None:
    """A trigger on ``kvchaos_engine_*`` can never be reached on vLLM (no such counter): the
    scenario is refused there at validation, not run to an inconclusive end."""
    from chaos.probes import Condition
    from chaos.scenario.needs import trigger_needs

    assert trigger_needs(Condition(metric="kvchaos_engine_lookup_timeouts_total", service="engine", grew_by=1)) == [
        "engine.metrics", "engine.kvchaos_metrics"]
    assert trigger_needs(Condition(metric="vllm:num_preemptions_total", service="engine", grew_by=1)) == [
        "engine.metrics"]
    assert trigger_needs(Condition(json="num_pending_lookups", url="/debug/state", service="engine",
                                   reached=1)) == ["engine.debug_state"]
    assert trigger_needs(Condition(metric="lmcache_mp_lookup_hit_tokens_total", service="lmcache",
                                   grew_by=1)) == ["lmcache.http"]
    assert trigger_needs(Condition(log="LOOKUP to \\S+ timed out", service="engine")) == []
    scenario = tmp_path / "s.yaml"
    scenario.write_text(f"""name: s
stack: {REPO / 'compose' / 'vllm-lmcache.yml'}
phases:
  - name: p
    trigger: {{metric: kvchaos_engine_aborts_total, service: engine, grew_by: 1}}
checks: {{evidence: {{}}}}
""")
    check = check_scenario(scenario)
    assert not check.ok
    msg = "\n".join(str(p) for p in check.problems)
    assert "s.yaml:5: phases[0].trigger[0]" in msg and "engine.kvchaos_metrics" in msg, msg


def _trigger_scenario(tmp_path: Path, stack: str, trigger: str) -> Path:
    path = tmp_path / "s.yaml"
    path.write_text(f"""name: s
stack: {REPO / 'compose' / stack}
phases:
  - name: p
    trigger: {trigger}
checks: {{evidence: {{}}}}
""")
    return path


def test_an_only_with_condition_needs_nothing_where_it_does_not_apply(tmp_path: Path) -> None:
    """The reference engine's counters ``only_with: engine.kvchaos_metrics`` next to a portable
    log line: runnable on vLLM (the counter is not watched there), and on the reference stack
    the counter's own needs still count."""
    from chaos.scenario.needs import missing, scenario_needs

    trigger = ("[{metric: kvchaos_engine_aborts_total, service: engine, grew_by: 1, only_with: "
               "engine.kvchaos_metrics}, {log: 'LOOKUP to \\S+ timed out', service: engine}]")
    for stack in ("vllm-lmcache.yml", "reference.yml"):
        check = check_scenario(_trigger_scenario(tmp_path, stack, trigger))
        assert check.ok, (stack, [str(p) for p in check.problems])
    scenario = load_scenario(_trigger_scenario(tmp_path, "reference.yml", trigger))
    needs = scenario_needs(scenario)
    assert [(n.capability, n.when) for n in needs] == [("engine.metrics", "engine.kvchaos_metrics"),
                                                       ("engine.kvchaos_metrics", "engine.kvchaos_metrics")]
    assert missing(needs, {"engine.kvchaos_metrics"}) == [needs[0]]  # offered the gate, not /metrics
    assert missing(needs, set()) == []


def test_a_trigger_with_every_condition_only_with_needs_one_of_them(tmp_path: Path) -> None:
    trigger = ("[{metric: kvchaos_engine_aborts_total, service: engine, grew_by: 1, only_with: "
               "engine.kvchaos_metrics}, {json: num_pending_lookups, url: /debug/state, service: engine, "
               "reached: 1, only_with: engine.debug_state}]")
    check = check_scenario(_trigger_scenario(tmp_path, "vllm-lmcache.yml", trigger))
    assert not check.ok
    msg = "\n".join(str(p) for p in check.problems)
    assert "s.yaml:5: phases[0].trigger" in msg and "every condition is only_with" in msg, msg
    assert "engine.debug_state" in msg and "engine.kvchaos_metrics" in msg, msg
    assert check_scenario(_trigger_scenario(tmp_path, "reference.yml", trigger)).ok


def test_cancel_at_state_needs_the_engines_request_states() -> None:
    """Only the reference engine reports request states: elsewhere no abort could land in the
    state asked for, and the run would end inconclusive (found on abort-during-lookup)."""
    from chaos.faults.cancel import CancelFault, CancelParams

    at = CancelParams(kind="cancel", mode="at_state", state="lookup", until="end")
    assert CancelFault.capability_needs(at) == {"engine.debug_state"}
    assert CancelFault.capability_needs(CancelParams(kind="cancel", mode="after_first_token", duration=1)) == set()


def test_a_fault_gated_by_a_capability_is_part_of_the_scenario_only_where_it_applies() -> None:
    """abort-during-lookup: the reference engine's at_state abort (``only_with:
    engine.debug_state``) and a client disconnect while the link holds the lookup (``unless_with``
    the same), for engines without request states: each stack runs exactly one of them, and
    neither's needs count where it is left out."""
    path = REPO / "scenarios" / "abort-during-lookup.yaml"
    on_ref = check_scenario(path)
    on_vllm = check_scenario(path, stack=REPO / "compose" / "vllm-cpu.yml")
    assert on_ref.ok and on_vllm.ok, ([str(p) for p in on_ref.problems], [str(p) for p in on_vllm.problems])
    assert [f.id for _, _, f in on_ref.scenario.faults()] == ["late-lookups", "abort-in-lookup"]
    assert [f.id for _, _, f in on_vllm.scenario.faults()] == ["late-lookups", "disconnect-in-lookup"]
    assert on_vllm.scenario.phases[1].faults[1].mode == "after_ms"
    # loaded without a stack, both stay (the file as written)
    assert len(load_scenario(path).phases[1].faults) == 3
    path = REPO / "scenarios" / "retrieve-fail-after-lookup.yaml"
    assert [f.id for _, _, f in check_scenario(path).scenario.faults()] == ["fail-retrieves"]
    on_vllm = check_scenario(path, stack=REPO / "compose" / "vllm-cpu.yml")
    assert [f.id for _, _, f in on_vllm.scenario.faults()] == ["slow-answers", "freeze-after-lookup"]


def test_a_fault_gate_must_name_a_known_capability_and_not_both_the_same(tmp_path: Path) -> None:
    for gate, err in (("only_with: engine.no_such", "only_with: unknown capability 'engine.no_such'"),
                      ("{only_with: engine.debug_state, unless_with: engine.debug_state}".strip("{}"),
                       "never run")):
        path = tmp_path / "g.yaml"
        path.write_text(textwrap.dedent(f"""\
            name: g
            stack: {REPO / 'compose' / 'reference.yml'}
            phases:
              - name: p
                faults:
                  - {{kind: latency, link: engine-lmcache, latency_ms: 10, until: end, {gate}}}
            checks: {{liveness: {{}}}}
            """))
        with pytest.raises(ConfigError) as exc:
            load_scenario(path)
        assert err in str(exc.value), str(exc.value)


HIT_QUALITY = """\
name: hit-quality-needs
stack: stack.yml
phases:
  - name: warm
  - name: hit
checks:
  hit_quality: {phases: [hit], min_correct_hit_rate: 1.0}
"""


def test_hit_quality_on_a_stack_without_cache_accounting_is_rejected_before_anything_starts(tmp_path: Path) -> None:
    """hit_quality reads each request's cached_token_stats: on a stack that gives none (BARE, as
    compose/sglang-lmcache.yml) every phase could only be unknown, so validation says so at the
    check's line; its correct-hit rate needs the recompute twin too."""
    from chaos.checks.registry import get as get_check

    spec = get_check("hit_quality")
    assert spec.capability_needs({"phases": ["hit"], "min_token_hit_rate": 0.9}) == {"engine.cache_stats"}
    assert spec.capability_needs({"phases": ["hit"], "min_correct_hit_rate": 1.0}) == {"engine.cache_stats",
                                                                                     "recompute"}
    no_twin = BARE.replace("  recompute_url: http://127.0.0.1:${RECOMPUTE_PORT:-18101}\n", "")
    path = _write(tmp_path, no_twin, HIT_QUALITY)
    r = runner.invoke(app, ["validate", str(path)])
    assert r.exit_code == 2, r.output
    for what in ("s.yaml:7: ", "check hit_quality needs engine.cache_stats", "check hit_quality needs recompute"):
        assert what in r.stderr, (what, r.stderr)
    offered = no_twin + "  capabilities: [engine.cache_stats]\n"
    path = _write(tmp_path, offered, HIT_QUALITY.replace("min_correct_hit_rate", "min_token_hit_rate"))
    r = runner.invoke(app, ["validate", str(path)])
    assert r.exit_code == 0, r.output + r.stderr
