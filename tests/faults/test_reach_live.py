"""docs/reach.md against a running LMCache (the reference stack's storage side, driven by
LMCache's own CPU client): every /metrics name of its table is exported once traffic flowed
(but those that appear on a first failure), and every /status field it lists is there."""

from __future__ import annotations

import re
from pathlib import Path

import httpx
import pytest

from chaos.probes import json_at, read_metric
from kvchaos_support import lmcache_bench, needs_lmcache, needs_redis, needs_root

DOC = (Path(__file__).resolve().parents[2] / "docs" / "reach.md").read_text()
LMCACHE = DOC.split("## LMCache")[1].split("## Logs")[0]
pytestmark = [pytest.mark.slow, needs_lmcache, needs_redis, needs_root]


def table_metrics() -> tuple[list[str], list[str]]:
    """(names exported after plain traffic, names that appear on a first failure)."""
    plain, on_failure = [], []
    for row in LMCACHE.splitlines():
        if not row.startswith("| `lmcache_mp_"):
            continue
        names = re.findall(r"`(lmcache_mp_[a-z0-9_]+)`", row.split("|")[1])
        (on_failure if "appears on the first failure" in row else plain).extend(names)
    return plain, on_failure


def status_paths() -> list[str]:
    text = LMCACHE.split("`/status` fields")[1].split("```")[0]
    out = ["is_healthy", "active_sessions"]
    out += [f"storage_manager.l1_manager.{f}" for f in re.findall(r"`([a-z_]+)`", text.split("under `storage_manager.l1_manager`:")[1].split(";")[0])]
    out += ["storage_manager.l2_adapters.0.is_healthy"]
    out += [f"storage_manager.prefetch_controller.{f}" for f in ("in_flight_request_count", "lookup_phase_count", "load_phase_count")]
    out += [f"storage_manager.store_controller.{f}" for f in ("pending_keys_count", "in_flight_task_count")]
    return out


def test_metric_names_and_status_fields_are_there(reference_storage):
    s = reference_storage
    lmcache_bench(s, 512)                                     # stores to L1 and both L2s
    httpx.post(f"{s.settings.lmcache_http}/cache/clear", json={"tier": "l1", "force": False},
               timeout=10).raise_for_status()
    lmcache_bench(s, 512)                                     # loads from L2
    plain, on_failure = table_metrics()
    assert len(plain) >= 20 and on_failure
    missing = [m for m in plain if not read_metric(f"{s.settings.lmcache_http}/metrics", m)[1]]
    assert not missing, f"docs/reach.md lists metrics this LMCache does not export: {missing}"
    import lmcache

    src = "\n".join(p.read_text(errors="replace") for p in Path(lmcache.__file__).parent.rglob("metrics/*.py"))
    for m in on_failure:  # lmcache_mp_l2_prefetch_failure_chunks_total <- "lmcache_mp.l2_prefetch_failure"
        stem = re.sub(r"_(chunks|keys|tokens|requests)?_total$", "", m).replace("lmcache_mp_", "lmcache_mp.", 1)
        stem = re.sub(r"_chunks$", "", stem)
        assert f'"{stem}"' in src, f"{m}: no meter {stem!r} in LMCache's source"
    status = httpx.get(f"{s.settings.lmcache_http}/status", timeout=10).json()
    for path in status_paths():
        json_at(status, path)  # KeyError when docs/reach.md names a field LMCache does not have
