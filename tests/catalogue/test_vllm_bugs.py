"""The vLLM stack's planted bugs (chaos/vllm/bugs.py) without vLLM: the bug set a stack file
names, the zoo's plan on it, the import hook that patches a module when it is imported, and the
wrappers on LMCache's own connector classes when this Python can import them (only the vLLM venv
can: they import vllm; skipped otherwise). The runs on the real stack: tests/vllm/test_bugs.py."""

from __future__ import annotations

import importlib
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


def test_the_import_hook_patches_the_module_when_it_is_imported(tmp_path, monkeypatch):
    """A module named like LMCache's metadata module, with a tracker class, imported after
    install: the drop-cache-salt wrapper is in place and drops the salt."""
    pkg = tmp_path / "lmcache" / "integration" / "vllm"
    pkg.mkdir(parents=True)
    for d in (tmp_path / "lmcache", tmp_path / "lmcache/integration", pkg):
        (d / "__init__.py").write_text("")
    (pkg / "lmcache_mp_metadata.py").write_text(
        "class LMCacheMPRequestTracker:\n"
        "    def __init__(self, request):\n"
        "        self.cache_salt = request.cache_salt or ''\n")
    for name in [m for m in sys.modules if m == "lmcache" or m.startswith("lmcache.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.syspath_prepend(str(tmp_path))
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
