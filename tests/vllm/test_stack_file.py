"""compose/vllm-cpu.yml as kvchaos reads it: what the catalogue can run there, and the vLLM
command lines its `sh -c` wrappers build (a stand-in `kvchaos` prints them; no vLLM starts)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from typer.testing import CliRunner

from chaos.scenario.cli import app
from chaos.scenario.loader import discover_scenarios
from chaos.stack.spec import load_stack

REPO = Path(__file__).resolve().parents[2]
STACK = REPO / "compose" / "vllm-cpu.yml"
CATALOGUE = REPO / "scenarios"
#: What the real vLLM cannot run today and the capability each names (as on the GPU stack).
# abort-during-lookup, abort-during-load, retrieve-fail-after-lookup and load-fail-policy-fail run there in a
# vLLM-native form (fault-level unless_with: docs/vllm-cpu.md, "The whole catalogue on vllm-cpu").
NOT_RUNNABLE = {
    "retrieve-dropped-slow-link": "engine.hooks.stall",
    "end-session-dropped-on-late-ack": "engine.hooks.lmcache", "free-lookup-locks-unknown-request": "engine.hooks.lmcache",
    # its window is proven only by the reference engine's count of lost END_SESSIONs
    "end-session-lost-on-reset": "engine.kvchaos_metrics",
    # its window is proven only by the reference engine's count of lost FREE_LOOKUP_LOCKS
    "lock-free-lost-on-cut": "engine.kvchaos_metrics",
}


def test_list_refuses_exactly_the_scenarios_that_need_the_reference_engine():
    r = CliRunner().invoke(app, ["list", str(CATALOGUE), "--stack", str(STACK), "--json"])
    rows = {row["name"]: row for row in (json.loads(line) for line in r.stdout.splitlines() if line.startswith("{"))}
    assert len(rows) == len(discover_scenarios(CATALOGUE))
    blocked = {n: row["needs"] for n, row in rows.items() if not row["runnable"]}
    assert set(blocked) == set(NOT_RUNNABLE), blocked
    for name, cap in NOT_RUNNABLE.items():
        assert any(cap in line for line in blocked[name]), blocked[name]
    assert r.exit_code == 2


def _argv(service: str, tmp_path: Path, **variables: str) -> list[str]:
    fake = tmp_path / "bin" / "kvchaos"
    fake.parent.mkdir(exist_ok=True)
    fake.write_text("#!/bin/sh\nfor a in \"$@\"; do echo \"$a\"; done\n")
    fake.chmod(0o755)
    spec = load_stack(STACK, environ={**os.environ, **variables}, run_dir=tmp_path, require_commands=False,
                      allocate_ports=False)
    svc = spec.services[service]
    env = {**os.environ, **svc.env(), "PATH": f"{fake.parent}:{os.environ['PATH']}"}
    out = subprocess.run(svc.argv("local"), env=env, capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    return out.stdout.splitlines()


def _last(argv: list[str], flag: str) -> str:
    return argv[len(argv) - 1 - argv[::-1].index(flag) + 1]


def test_small_kv_pool_uses_32_token_blocks_on_both_vllms(tmp_path):
    engine = _argv("engine", tmp_path, ENGINE_NUM_BLOCKS="110")
    twin = _argv("engine-recompute", tmp_path, ENGINE_NUM_BLOCKS="110")
    # 110 blocks of 16 tokens = 55 of 32, the smallest block vLLM's CPU attention takes
    assert engine[:2] == ["vllm", "serve"] and _last(engine, "--num-gpu-blocks-override") == "55"
    assert _last(engine, "--max-model-len") == str(110 * 16 - 32)  # vLLM refuses a longer one
    assert _last(engine, "--block-size") == _last(twin, "--block-size") == "32"
    assert "--num-gpu-blocks-override" not in twin and "--kv-transfer-config" not in twin


def test_default_pool_and_connector_config(tmp_path):
    engine = _argv("engine", tmp_path)
    twin = _argv("engine-recompute", tmp_path)
    assert "--num-gpu-blocks-override" not in engine
    assert _last(engine, "--block-size") == _last(twin, "--block-size") == "128"
    assert "--no-enable-prefix-caching" in engine and "--no-enable-prefix-caching" in twin
    cfg = json.loads(_last(engine, "--kv-transfer-config"))
    assert cfg["kv_connector"] == "LMCacheMPConnector" and cfg["kv_role"] == "kv_both"
    assert cfg["kv_connector_extra_config"]["lmcache.mp.port"] == 23556  # the engine-lmcache link
    assert "--enable-prefix-caching" in _argv("engine", tmp_path, KVCHAOS_ENGINE_PREFIX_CACHING="--enable-prefix-caching")


def test_both_vllms_bind_their_ipc_sockets_in_the_stacks_socket_folder(tmp_path):
    """The input that showed it: 390 of vLLM's ZeroMQ IPC sockets (``/tmp/<uuid4>``, about 56 per
    `make vllm-tier`) were left in /tmp by vLLMs that kvchaos killed or restarted (2026-12-07)."""
    from chaos.stack.spec import socket_dir

    spec = load_stack(STACK, environ=dict(os.environ), run_dir=tmp_path, require_commands=False,
                      allocate_ports=False)
    for service in ("engine", "engine-recompute"):
        assert spec.services[service].env()["VLLM_RPC_BASE_PATH"] == str(socket_dir(tmp_path)), service
    assert "KVCHAOS_SOCKET_DIR" in spec.variables_read  # so the local backend removes it at down
