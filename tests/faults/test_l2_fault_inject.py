"""l2_fault_inject against the reference stack's storage side as real processes: LMCache is
restarted with its own fault_inject adapter around the Redis and fs L2 adapters (through the
stack file's wrap variables), loads of keys that lookups found fail, LMCache counts them, and
heal restarts it with the plain adapters."""

from __future__ import annotations

import os
from pathlib import Path

import httpx
import pytest
from pydantic import ValidationError

from chaos.faults.base import FaultContext
from chaos.faults.l2_fault_inject import wrappable_adapters
from chaos.stack.local import LocalStack
from kvchaos_support import fault, lmcache_bench as bench, local_stack, needs_lmcache, needs_redis, needs_root

REPO = Path(__file__).resolve().parents[2]


def adapters(stack) -> list[dict]:
    return httpx.get(f"{stack.settings.lmcache_http}/status", timeout=10).json()["storage_manager"]["l2_adapters"]


def test_the_shipped_stacks_let_both_adapters_be_wrapped(tmp_path):
    ref = LocalStack(REPO / "compose/reference.yml", run_dir=tmp_path / "r", environ=dict(os.environ))
    assert [(a.type, a.before, a.after) for a in wrappable_adapters(ref)] == [
        ("resp", "LMCACHE_L2_RESP_WRAP", "LMCACHE_L2_RESP_WRAP_END"),
        ("fs", "LMCACHE_L2_FS_WRAP", "LMCACHE_L2_FS_WRAP_END")]
    from types import SimpleNamespace

    from chaos.stack.spec import load_stack

    for gpu_stack in ("compose/vllm-lmcache.yml", "compose/sglang-lmcache.yml"):
        spec = load_stack(REPO / gpu_stack, allocate_ports=False, require_commands=False)
        gpu = SimpleNamespace(spec=spec, settings=spec.settings, env=spec.env, backend="compose")
        assert [a.type for a in wrappable_adapters(gpu)] == ["resp", "fs"], gpu_stack
        assert "lmcache.l2_wrap" in spec.capabilities(), gpu_stack


@pytest.mark.slow
@needs_lmcache
@needs_redis
@needs_root
def test_loads_fail_counted_by_lmcache_and_heal_unwraps(reference_storage):
    bench(reference_storage, 1024)  # 4 chunks in L1, Redis and fs
    f = fault("l2_fault_inject", rate=1.0, seed=3, settle=0)
    ctx = FaultContext(stack=reference_storage)
    done = f.apply(ctx)
    assert done["restarted"] == ["lmcache"] and done["active"] == 2
    assert all(a["fault_inject"]["rate"] == 1.0 and a["fault_inject"]["seed"] == 3 for a in adapters(reference_storage))
    bench(reference_storage, 1024)  # L1 is empty after the restart: lookups find the keys in L2, loads fail
    healed = f.heal(ctx)
    assert healed["restored"] is True and healed["restarted"] == ["lmcache"]
    assert not any("fault_inject" in a for a in adapters(reference_storage))
    ev = f.evidence(ctx)
    assert ev["bit"] is True and ev["wrapper_active"] is True and ev["lmcache_load_failures"] >= 4, ev


@pytest.mark.slow
@needs_lmcache
@needs_redis
@needs_root
def test_no_load_in_place_did_not_bite(reference_storage):
    f = fault("l2_fault_inject", adapters=["fs"], gap_indices=[0], settle=0)
    ctx = FaultContext(stack=reference_storage)
    assert f.apply(ctx)["active"] == 1
    f.heal(ctx)
    ev = f.evidence(ctx)
    assert ev["bit"] is False and ev["lmcache_load_failures"] == 0
    assert "no load from a wrapped adapter failed" in ev["reason"]


def test_a_stack_without_wrap_variables_is_refused(tmp_path):
    from kvchaos_support import LMCACHE_FS_STACK

    stack = local_stack(tmp_path, LMCACHE_FS_STACK)
    f = fault("l2_fault_inject", rate=0.5)
    with pytest.raises(RuntimeError, match=r"no wrappable --l2-adapter .*wrappable: none"):
        f.apply(FaultContext(stack=stack))
    assert f.heal(FaultContext(stack=stack))["restored"] is False
    assert f.evidence(FaultContext(stack=stack))["bit"] is False


def test_nothing_to_fail_is_refused():
    with pytest.raises(ValidationError, match="nothing would fail"):
        fault("l2_fault_inject")
    with pytest.raises(ValidationError):
        fault("l2_fault_inject", gap_tail_ratios=[1.5])
