"""The shipped stack files are valid compose files, as written and as ComposeStack resolves them."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import yaml

from chaos.stack.compose import compose_command, resolved_compose
from chaos.stack.spec import load_stack

REPO = Path(__file__).resolve().parents[2]
SHIPPED = [REPO / "compose" / "reference.yml", REPO / "compose" / "vllm-lmcache.yml"]

pytestmark = pytest.mark.slow


def compose_config(path: Path, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([*compose_command(), "-f", str(path), "--project-directory", str(cwd), "config", "-q"],
                          capture_output=True, text=True, env=env, timeout=120)


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_compose_config_accepts_the_file_as_written(path: Path, tmp_path: Path) -> None:
    env = {**os.environ, "KVCHAOS_RUN_DIR": str(tmp_path)}
    r = compose_config(path, env, path.parent)
    assert r.returncode == 0, f"{' '.join(compose_command())} config rejected {path.name}:\n{r.stderr}"


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_compose_config_accepts_the_resolved_file(path: Path, tmp_path: Path) -> None:
    spec = load_stack(path, run_dir=tmp_path, require_commands=False)
    doc = resolved_compose(spec, "test-run", tmp_path)
    out = tmp_path / "resolved.yml"
    out.write_text(yaml.safe_dump(doc, sort_keys=False))
    r = compose_config(out, dict(os.environ), path.parent)
    assert r.returncode == 0, f"compose config rejected the resolved {path.name}:\n{r.stderr}"
    # Nothing left for compose to interpolate but escaped dollars, and every service labelled
    # and telemetry-free.
    for name, svc in doc["services"].items():
        assert svc["labels"]["io.kvchaos.run"] == "test-run", name
        assert svc["environment"]["LMCACHE_TRACK_USAGE"] == "false", name
        assert f"{tmp_path}:{tmp_path}" in svc["volumes"], name
    assert "${" not in out.read_text().replace("$${", "")


def test_compose_config_rejects_a_broken_file(tmp_path: Path) -> None:
    """The check above can fail: a service with an unknown key is refused."""
    bad = tmp_path / "bad.yml"
    bad.write_text("services:\n  a:\n    image: x\n    no_such_key: 1\n")
    r = compose_config(bad, dict(os.environ), tmp_path)
    assert r.returncode != 0
