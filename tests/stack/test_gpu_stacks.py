"""The GPU stack files (vLLM, SGLang) without a GPU: compose accepts them, the whole catalogue is
checked against each (runnable, or what it needs there), and their engine commands pass the
scenario's knobs the way the engines take them.

What only a GPU host can show (the engines serving, the catalogue's verdicts there) is run by
``kvchaos run --backend compose --stack compose/vllm-lmcache.yml scenarios/`` (README).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from chaos.scenario.cli import app
from chaos.scenario.loader import discover_scenarios
from chaos.stack.base import StackError
from chaos.stack.compose import compose_command, resolved_compose
from chaos.stack.spec import load_stack

REPO = Path(__file__).resolve().parents[2]
CATALOGUE = REPO / "scenarios"
VLLM = REPO / "compose" / "vllm-lmcache.yml"
SGLANG = REPO / "compose" / "sglang-lmcache.yml"
GPU_STACKS = [VLLM, SGLANG]
runner = CliRunner()

#: What the vLLM stack cannot run, and the capability each names: holding the engine before its
#: retrieve (the reference engine's stall hook), a raw LMCache adapter call through the engine,
#: and aborts aimed at a request state (its /debug/requests/{id}).
#: Triggers on the reference engine's own kvchaos_engine_* counters are `only_with:
#: engine.kvchaos_metrics` next to a portable condition (LMCache's client adapter log lines in
#: the engine log, vLLM's names, LMCache's own metrics), so they block nothing there.
#: abort-during-lookup, abort-during-load, retrieve-fail-after-lookup and load-fail-policy-fail run there through
#: their vLLM-native windows (faults gated by `only_with` / `unless_with`: a client disconnect
#: while the link holds the lookup's answer; the link held and LMCache frozen after the lookups,
#: with the fail policy for load-fail-policy-fail).
VLLM_NOT_RUNNABLE = {
    "retrieve-dropped-slow-link": "engine.hooks.stall",
    "end-session-dropped-on-late-ack": "engine.hooks.lmcache", "free-lookup-locks-unknown-request": "engine.hooks.lmcache",
    # its window is proven only by the reference engine's count of lost END_SESSIONs
    "end-session-lost-on-reset": "engine.kvchaos_metrics",
    # its window is proven only by the reference engine's count of lost FREE_LOOKUP_LOCKS
    "lock-free-lost-on-cut": "engine.kvchaos_metrics",
}


def _listing(stack: Path) -> tuple[int, dict[str, dict]]:
    r = runner.invoke(app, ["list", str(CATALOGUE), "--stack", str(stack), "--json"])
    rows = [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]
    return r.exit_code, {row["name"]: row for row in rows}


@pytest.mark.parametrize("stack", GPU_STACKS, ids=lambda p: p.name)
def test_compose_config_accepts_the_gpu_stack(stack: Path, tmp_path: Path) -> None:
    try:
        cli = compose_command()
    except StackError as exc:
        pytest.skip(f"no compose CLI: {exc}")
    for path in (stack, tmp_path / "resolved.yml"):
        if path.name == "resolved.yml":  # also as the compose backend writes it
            spec = load_stack(stack, run_dir=tmp_path, require_commands=False)
            path.write_text(yaml.safe_dump(resolved_compose(spec, "t", tmp_path), sort_keys=False))
        r = subprocess.run([*cli, "-f", str(path), "--project-directory", str(stack.parent), "config", "-q"],
                           capture_output=True, text=True, timeout=120,
                           env={**os.environ, "KVCHAOS_RUN_DIR": str(tmp_path)})
        assert r.returncode == 0, f"{' '.join(cli)} config rejected {path}:\n{r.stderr}"


def test_every_catalogue_scenario_runs_on_vllm_or_names_its_need() -> None:
    """Each scenario is runnable on the vLLM stack or names what it needs (exactly these)."""
    code, rows = _listing(VLLM)
    assert len(rows) == len(discover_scenarios(CATALOGUE)) >= 20
    blocked = {n: r for n, r in rows.items() if not r["runnable"]}
    assert set(blocked) == set(VLLM_NOT_RUNNABLE), {n: r["needs"] for n, r in blocked.items()}
    for name, cap in VLLM_NOT_RUNNABLE.items():
        assert any(cap in line for line in blocked[name]["needs"]), blocked[name]["needs"]
    assert code == 2  # some scenario cannot run there


def test_every_catalogue_scenario_on_sglang_is_runnable_or_names_its_need() -> None:
    code, rows = _listing(SGLANG)
    runnable = {n for n, r in rows.items() if r["runnable"]}
    assert {"preemption", "disk-full", "l2-partial-read", "l2-load-fail-after-lookup"} <= runnable
    for name, row in rows.items():
        assert row["runnable"] or row["needs"], name
    # No per-request LMCache accounting on SGLang: hit_recovery and hit_quality cannot decide
    # there (smoke's hit_quality was unknown on every run, with nothing said before it started).
    assert any("engine.cache_stats" in n for n in rows["lookup-timeout"]["needs"])
    assert any("engine.cache_stats" in n and "hit_quality" in n for n in rows["smoke"]["needs"]), rows["smoke"]
    assert code == 2


def test_validate_with_the_whole_catalogue_on_vllm_reports_file_and_line() -> None:
    r = runner.invoke(app, ["validate", str(CATALOGUE), "--stack", str(VLLM)])
    assert r.exit_code == 2
    assert f"{CATALOGUE / 'smoke.yaml'}: ok" in r.stdout
    err = r.stderr
    assert "retrieve-dropped-slow-link.yaml:" in err and "engine.hooks.stall" in err
    assert "load-fail-policy-fail.yaml:" not in err  # its vLLM-native window is unless_with
    assert "phases[1].faults[0]" in err and "compose/vllm-lmcache.yml does not offer it" in err
    assert "lookup-timeout.yaml:" not in err  # its reference-only counter is only_with
    assert sum(": ok" in line for line in r.stdout.splitlines()) == (len(discover_scenarios(CATALOGUE))
                                                                      - len(VLLM_NOT_RUNNABLE))


def test_reference_stack_runs_the_whole_catalogue() -> None:
    code, rows = _listing(REPO / "compose" / "reference.yml")
    assert code == 0 and all(r["runnable"] for r in rows.values())


def _engine_argv(stack: Path, program: str, tmp_path: Path, **variables: str) -> list[str]:
    """The engine's argv of ``stack`` with ``variables``, run through its `sh -c` with a
    ``program`` on PATH that prints its arguments, one a line."""
    fake = tmp_path / "bin" / program
    fake.parent.mkdir(exist_ok=True)
    fake.write_text("#!/bin/sh\nfor a in \"$@\"; do echo \"$a\"; done\n")
    fake.chmod(0o755)
    spec = load_stack(stack, environ={**os.environ, **variables}, run_dir=tmp_path, require_commands=False,
                      allocate_ports=False)
    svc = spec.services["engine"]
    env = {**os.environ, **svc.env(), "PATH": f"{fake.parent}:{os.environ['PATH']}"}
    out = subprocess.run(svc.argv("compose"), env=env, capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    return out.stdout.splitlines()


def test_vllm_engine_command_passes_the_kv_pool_only_when_set(tmp_path: Path) -> None:
    """The engine's argv, run through its `sh -c` with a `vllm` that prints its arguments:
    ENGINE_NUM_BLOCKS becomes --num-gpu-blocks-override; unset, no override; the prefix cache
    follows engine.prefix_caching."""
    def argv_with(**variables: str) -> list[str]:
        return _engine_argv(VLLM, "vllm", tmp_path, **variables)

    small = argv_with(ENGINE_NUM_BLOCKS="110")
    assert small[0] == "serve" and small[-2:] == ["--num-gpu-blocks-override", "110"]
    assert "--no-enable-prefix-caching" in small
    default = argv_with()
    assert "--num-gpu-blocks-override" not in default
    assert json.loads(default[default.index("--kv-transfer-config") + 1])["kv_connector"] == "LMCacheMPConnector"
    assert "--enable-prefix-caching" in argv_with(KVCHAOS_ENGINE_PREFIX_CACHING="--enable-prefix-caching")


def test_the_cpu_vllm_engine_asks_for_a_model_length_its_pool_holds(tmp_path: Path) -> None:
    """Input that showed it: `kvchaos explore --stack compose/vllm-cpu.yml --seed 4101` run 11
    (2026-12-07) drew ENGINE_NUM_BLOCKS=133 (16-token blocks): the engine got
    --num-gpu-blocks-override 66 (32-token blocks) and --max-model-len 2096, and vLLM refused to
    start ("To serve at least one request with the model's max seq len (2096) ... the estimated
    maximum model length is 2080": 65 blocks, one of the 66 is vLLM's null block). The model
    length must fit (blocks - 1) x 32 tokens for odd counts too; for even ones it is unchanged."""
    for n, blocks, length in ((133, 66, 2080), (110, 55, 1728)):
        argv = _engine_argv(REPO / "compose" / "vllm-cpu.yml", "kvchaos", tmp_path, ENGINE_NUM_BLOCKS=str(n))
        assert argv[argv.index("--num-gpu-blocks-override") + 1] == str(blocks)
        lengths = [int(argv[i + 1]) for i, a in enumerate(argv) if a == "--max-model-len"]
        assert lengths[-1] == length <= (blocks - 1) * 32, (n, lengths)  # the last one given wins


def test_the_gpu_vllm_stack_carries_what_the_cpu_vllm_stack_established(tmp_path: Path) -> None:
    """What compose/vllm-cpu.yml checked on the real vLLM and is the same vLLM/LMCache code on a
    GPU: the link effects' metric names, lmcache_url (diagnose reads LMCache itself, not the
    faulted link) and --enable-prompt-tokens-details (vLLM's cached-token count)."""
    gpu = load_stack(VLLM, environ=dict(os.environ), run_dir=tmp_path, require_commands=False,
                     allocate_ports=False)
    cpu = load_stack(REPO / "compose" / "vllm-cpu.yml", environ=dict(os.environ), run_dir=tmp_path,
                     require_commands=False, allocate_ports=False)
    for link in ("engine-lmcache", "lmcache-redis"):
        metrics = [e.metric for e in gpu.settings.links[link].effects]
        assert metrics and metrics == [e.metric for e in cpu.settings.links[link].effects], link
    assert gpu.settings.lmcache_url and gpu.settings.lmcache_url.endswith(":5555")
    assert "--enable-prompt-tokens-details" in gpu.services["engine"].argv("compose")
    assert "--enable-prompt-tokens-details" in cpu.services["engine"].argv("compose")


def test_sglang_engine_command_writes_the_lmcache_client_config(tmp_path: Path) -> None:
    """The engine's `sh -c` with a stand-in `sglang.launch_server` module that prints argv: the
    LMCache config file it writes points at the proxy link; the KV pool becomes
    --max-total-tokens (16 tokens per block)."""
    mod = tmp_path / "py" / "sglang"
    mod.mkdir(parents=True)
    (mod / "__init__.py").write_text("")
    (mod / "launch_server.py").write_text("import sys\nfor a in sys.argv[1:]:\n    print(a)\n")
    spec = load_stack(SGLANG, environ={**os.environ, "ENGINE_NUM_BLOCKS": "110", "SGLANG_DETERMINISTIC": "1"},
                      run_dir=tmp_path, require_commands=False, allocate_ports=False)
    svc = spec.services["engine"]
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python3").symlink_to(sys.executable)
    env = {**os.environ, **svc.env(), "PYTHONPATH": str(tmp_path / "py"), "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    out = subprocess.run(svc.argv("compose"), env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    args = out.stdout.splitlines()
    assert "--enable-lmcache" in args and args[args.index("--max-total-tokens") + 1] == "1760"
    assert "--enable-deterministic-inference" in args
    config = yaml.safe_load(Path(args[args.index("--lmcache-config-file") + 1]).read_text())
    link = spec.settings.links["engine-lmcache"].listen
    assert config == {"mp_host": "tcp://127.0.0.1", "mp_port": int(link.rsplit(":", 1)[1]),
                      "extra_config": {"lmcache.mp.mq_timeout": 5}}


def test_run_refuses_overrides_the_gpu_stack_cannot_honour() -> None:
    """`run --stack vllm --numerics batch-dependent` (a reference-engine mode) is refused before
    anything starts; tolerant mode needs logprobs, which vLLM has and SGLang's stack lacks."""
    from chaos.runner.suite import load_and_validate
    from chaos.yamlsource import ConfigError

    smoke = [CATALOGUE / "smoke.yaml"]
    with pytest.raises(ConfigError, match="var:KVCHAOS_ENGINE_NUMERICS"):
        load_and_validate(smoke, VLLM, numerics="batch-dependent")
    assert load_and_validate(smoke, VLLM, equivalence="tolerant")[0].checks.recompute_equivalence.mode == "tolerant"
    with pytest.raises(ConfigError, match="engine.logprobs"):
        load_and_validate(smoke, SGLANG, equivalence="tolerant")
