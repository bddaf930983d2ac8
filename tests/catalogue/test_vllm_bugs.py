"""The vLLM stack's planted bugs (chaos/vllm/bugs.py) without vLLM: the bug set a stack file
names, the zoo's plan on it, the import hook that patches a module when it is imported, and the
wrappers on LMCache's own connector classes when this Python can import them (only the vLLM venv
can: they import vllm; skipped otherwise). The runs on the real stack: tests/vllm/test_bugs.py."""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from chaos.engine.bugs import BUGS as REFERENCE_BUGS
from chaos.runner.suite import load_and_validate
from chaos.scenario.loader import discover_scenarios, load_scenario
from chaos.vllm import bugs
from chaos.zoo import CLEAN, ZOO_MAP, bug_set, plan_rows

REPO = Path(__file__).resolve().parents[2]
VLLM_STACK = REPO / "compose/vllm-cpu.yml"
CATALOGUE = {load_scenario(p).name: p for p in discover_scenarios(REPO / "scenarios")}


def test_the_vllm_stack_file_names_the_vllm_bug_set():
    known, zoo_map = bug_set(VLLM_STACK)
    assert set(known) == set(bugs.BUGS) and zoo_map is bugs.ZOO_MAP
    ref_known, ref_map = bug_set(REPO / "compose/reference.yml")
    assert set(ref_known) == set(REFERENCE_BUGS) and ref_map is ZOO_MAP
    assert bug_set(None)[0] == REFERENCE_BUGS


def test_every_vllm_bug_has_scenarios_that_run_on_the_vllm_stack():
    assert set(bugs.ZOO_MAP) == set(bugs.BUGS)
    wanted = sorted({n for names in bugs.ZOO_MAP.values() for n in names})
    assert wanted and all(n in CATALOGUE for n in wanted)
    # load_and_validate raises ConfigError naming the need when one cannot run there
    assert [s.name for s in load_and_validate([CATALOGUE[n] for n in wanted], VLLM_STACK)] == wanted
    plan = plan_rows(sorted(CATALOGUE), ["drop-cache-salt"], zoo_map=bugs.ZOO_MAP)
    assert plan["drop-cache-salt"] == ["tenant-isolation"] and plan[CLEAN] == sorted(CATALOGUE)


def test_same_names_mean_the_same_class_on_both_engines():
    shared = set(bugs.BUGS) & set(REFERENCE_BUGS)
    assert {"hit-plus-one-chunk", "hit-plus-one-token", "drop-cache-salt", "skip-abort-cleanup"} <= shared


def test_unknown_bug_is_refused_with_the_known_ones():
    with pytest.raises(ValueError, match="unknown bug no-such-bug .*known: drop-cache-salt"):
        bugs.install(["no-such-bug"])


def _lmcache_modules() -> dict:
    return {m: mod for m, mod in sys.modules.items() if m == "lmcache" or m.startswith("lmcache.")}


@contextlib.contextmanager
def _fake_lmcache_package(root: Path):
    """A package named ``lmcache`` under ``root`` with a metadata module shaped like LMCache's,
    importable inside the block; on exit sys.modules holds again exactly the ``lmcache`` modules
    it held before (the fake ones out, the real ones back), so a later test that imports LMCache
    in the same process gets LMCache, not the fake."""
    pkg = root / "lmcache" / "integration" / "vllm"
    pkg.mkdir(parents=True)
    for d in (root / "lmcache", root / "lmcache/integration", pkg):
        (d / "__init__.py").write_text("")
    (pkg / "lmcache_mp_metadata.py").write_text(
        "class LMCacheMPRequestTracker:\n"
        "    def __init__(self, request):\n"
        "        self.cache_salt = request.cache_salt or ''\n")
    saved = _lmcache_modules()
    for name in saved:
        del sys.modules[name]
    sys.path.insert(0, str(root))
    try:
        yield pkg
    finally:
        sys.path.remove(str(root))
        for name in _lmcache_modules():
            del sys.modules[name]
        sys.modules.update(saved)
        importlib.invalidate_caches()


def test_the_fake_lmcache_package_leaves_sys_modules_as_it_found_it(tmp_path):
    """Input that showed it (CI, xdist worker gw0 with --dist loadfile): this file, then
    tests/checks/test_leaks_expired.py in the same process, failed with "No module named
    'lmcache.lmcache_native'": the fake ``lmcache`` stayed in sys.modules."""
    before = _lmcache_modules()
    with _fake_lmcache_package(tmp_path):
        assert importlib.import_module("lmcache").__file__ == str(tmp_path / "lmcache" / "__init__.py")
    assert _lmcache_modules() == before
    if importlib.util.find_spec("lmcache") is not None:
        assert not importlib.import_module("lmcache").__file__.startswith(str(tmp_path))


def test_the_import_hook_patches_the_module_when_it_is_imported(tmp_path, monkeypatch):
    """A module named like LMCache's metadata module, with a tracker class, imported after
    install: the drop-cache-salt wrapper is in place and drops the salt."""
    with _fake_lmcache_package(tmp_path) as pkg:
        monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))
        bugs.install(["drop-cache-salt"])
        mod = importlib.import_module(bugs.METADATA)
        assert mod.__file__ == str(pkg / "lmcache_mp_metadata.py")

        class Request:
            request_id, cache_salt = "r1", "tenant-1"

        assert mod.LMCacheMPRequestTracker(Request()).cache_salt == ""
        assert mod.LMCacheMPRequestTracker.__init__._kvchaos_bug == "drop-cache-salt"
        bugs.install(["drop-cache-salt"])  # a second install leaves one wrapper
        assert mod.LMCacheMPRequestTracker.__init__.__wrapped__.__qualname__ == "LMCacheMPRequestTracker.__init__"


def _lmcache_connector_importable() -> bool:
    """vllm-cpu and lmcache installed in this Python (by distribution: under pytest, ``vllm``
    may resolve to tests/vllm)."""
    import importlib.metadata

    try:
        importlib.metadata.distribution("vllm-cpu")
        importlib.metadata.distribution("lmcache")
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


@pytest.mark.skipif(not _lmcache_connector_importable(), reason="LMCache's vLLM connector needs vllm "
                    "(only .venv-vllm has it: tests/vllm/test_bugs.py runs this there)")
def test_every_bug_patches_lmcaches_own_connector_classes():
    r = subprocess.run([sys.executable, "-c", PATCH_ALL], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.split() == sorted(bugs.BUGS)


#: Run in a fresh Python: every bug installed, then LMCache's connector imported; prints the
#: names of the bugs whose wrappers are on its classes.
PATCH_ALL = ("import chaos.vllm.launch; from chaos.vllm import bugs; bugs.install(sorted(bugs.BUGS)); "
             "print(' '.join(bugs.patched()))")


def test_run_refuses_a_bug_the_stack_does_not_plant():
    from typer.testing import CliRunner

    from chaos.cli import app

    r = CliRunner().invoke(app, ["run", "--stack", str(VLLM_STACK), "--bug", "trust-failed-load",
                                 str(REPO / "scenarios/smoke.yaml")])
    assert r.exit_code == 2
    assert "--bug trust-failed-load: not a planted bug of" in r.output and "skip-end-session" in r.output
    r = CliRunner().invoke(app, ["run", "--bug", "skip-end-session", str(REPO / "scenarios/smoke.yaml")])
    assert r.exit_code == 2 and "compose/reference.yml; its bugs: drop-cache-salt" in r.output
