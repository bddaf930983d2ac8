"""``kvchaos engine serve``: run the reference engine (also ``python -m chaos.engine serve``)."""

from __future__ import annotations

import logging
import os
from typing import Optional

import typer

from chaos.engine.bugs import BUGS

app = typer.Typer(help="The kvchaos reference engine (CPU, vLLM-shaped, LMCache MP connector).",
                  no_args_is_help=True)


BUGS_ENV = "KVCHAOS_ENGINE_BUGS"


def bugs_from_environment() -> list[str]:
    """Bug names from ``KVCHAOS_ENGINE_BUGS`` (comma- or space-separated; empty = none).

    Lets a stack file plant bugs through its environment without changing the command line.
    """
    raw = os.environ.get(BUGS_ENV, "")
    return [b for b in raw.replace(",", " ").split() if b]


TEST_PATCH_ENV = "KVCHAOS_ENGINE_TEST_PATCH"


def apply_test_patch(core: object) -> str | None:
    """Tests only: ``KVCHAOS_ENGINE_TEST_PATCH=/path/file.py`` runs that file's
    ``install(core)`` on the engine before it starts (bug classes the zoo does not plant, which
    only a test enables; tests/diagnose/load_path_bugs.py). Returns the path, None when unset.

    Raises:
        RuntimeError: the file cannot be loaded or has no ``install``.
    """
    import importlib.util

    path = os.environ.get(TEST_PATCH_ENV, "").strip()
    if not path:
        return None
    spec = importlib.util.spec_from_file_location("kvchaos_engine_test_patch", path)
    if spec is None or spec.loader is None:
        raise RuntimeError(f"{TEST_PATCH_ENV}={path}: not a Python file")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if not hasattr(module, "install"):
        raise RuntimeError(f"{TEST_PATCH_ENV}={path}: no install(core)")
    module.install(core)
    return path


@app.callback()
def _main() -> None:
    """Reference engine commands."""


@app.command()
def serve(
    host: str = typer.Option("127.0.0.1", help="HTTP listen address."),
    port: int = typer.Option(8100, help="HTTP port."),
    served_model_name: str = typer.Option("kvchaos-ref", help="Model name in the API."),
    num_layers: int = typer.Option(4, help="Decoder layers."),
    hidden_size: int = typer.Option(512, help="Model width."),
    num_heads: int = typer.Option(8, help="Attention heads."),
    num_kv_heads: int = typer.Option(4, help="KV heads (GQA)."),
    intermediate_size: int = typer.Option(1024, help="MLP width."),
    vocab_size: int = typer.Option(512, help="Vocabulary (>= 259: bytes + specials)."),
    dtype: str = typer.Option("float32", help="float32 | bfloat16."),
    seed: int = typer.Option(0, help="Weight seed (torch.manual_seed)."),
    init_std: float = typer.Option(0.08, help="Std of the random weights."),
    num_blocks: int = typer.Option(1024, help="KV pool size in blocks."),
    block_size: int = typer.Option(16, help="Tokens per KV block (divides the chunk size)."),
    prefill_segment: int = typer.Option(
        256, help="Canonical prefill segment in tokens (divides LMCache's chunk size)."),
    max_num_seqs: int = typer.Option(16, help="Most requests running at once."),
    enable_prefix_caching: bool = typer.Option(
        False, "--enable-prefix-caching/--no-enable-prefix-caching",
        help="The engine's own prefix cache (APC)."),
    kv_connector: str = typer.Option("none", help="lmcache-mp | none."),
    kv_role: str = typer.Option("kv_both", help="kv_both | kv_producer (store only, never load)."),
    lmcache_url: str = typer.Option("tcp://127.0.0.1:5555", help="LMCache server ZMQ URL."),
    kv_load_failure_policy: str = typer.Option("recompute", help="recompute | fail."),
    lmcache_mq_timeout: float = typer.Option(5.0, help="Seconds one LMCache MQ call may take."),
    lmcache_heartbeat_interval: float = typer.Option(2.0, help="Seconds between LMCache pings."),
    threads: int = typer.Option(1, help="torch intra-op threads (fixed for bit-exactness)."),
    numerics: str = typer.Option(
        "exact", help="exact (bit-exact) | batch-dependent (results depend on the batch size, as "
        "non-batch-invariant GPU kernels do; for recompute_equivalence's tolerant mode)."),
    batch_noise: float = typer.Option(
        1e-3, help="batch-dependent numerics: relative size of the offset per layer."),
    bug: Optional[list[str]] = typer.Option(  # noqa: UP007 - typer needs Optional here
        None, help="Plant a known bug (repeatable; also KVCHAOS_ENGINE_BUGS, comma-separated): "
        + "; ".join(f"{k}: {v}" for k, v in BUGS.items())),
    log_level: str = typer.Option("info", help="debug | info | warning | error."),
) -> None:
    """Serve the engine over HTTP until interrupted."""
    from chaos.engine.measurement import start_coverage_from_environment

    start_coverage_from_environment()  # first: the engine modules below are then measured
    import uvicorn

    from chaos.engine.api import create_app
    from chaos.engine.config import EngineConfig
    from chaos.engine.model import ModelSpec
    from chaos.engine.scheduler import EngineCore

    logging.basicConfig(level=log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    config = EngineConfig(
        model=ModelSpec(num_layers=num_layers, hidden_size=hidden_size, num_heads=num_heads,
                        num_kv_heads=num_kv_heads, intermediate_size=intermediate_size,
                        vocab_size=vocab_size, dtype=dtype, seed=seed, init_std=init_std),
        served_model_name=served_model_name, num_blocks=num_blocks, block_size=block_size,
        prefill_segment=prefill_segment, max_num_seqs=max_num_seqs,
        enable_prefix_caching=enable_prefix_caching, kv_connector=kv_connector, kv_role=kv_role,
        lmcache_url=lmcache_url, kv_load_failure_policy=kv_load_failure_policy,
        lmcache_mq_timeout=lmcache_mq_timeout,
        lmcache_heartbeat_interval=lmcache_heartbeat_interval, threads=threads,
        bugs=list(bug or []) + bugs_from_environment(), numerics=numerics, batch_noise=batch_noise)
    try:
        config.validate()
    except ValueError as exc:
        typer.echo(f"kvchaos engine: {exc}", err=True)
        raise typer.Exit(2) from None
    core = EngineCore(config)
    patched = apply_test_patch(core)
    if patched:
        logging.getLogger("kvchaos.engine").warning("test patch %s installed", patched)
    core.start()
    logging.getLogger("kvchaos.engine").info(
        "engine %s fingerprint=%s bugs=%s listening on %s:%d", served_model_name,
        core.fingerprint, config.bugs, host, port)
    try:
        uvicorn.run(create_app(core), host=host, port=port, log_level=log_level,
                    access_log=False)
    finally:
        core.stop()
