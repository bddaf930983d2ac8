"""Engine settings (one field per ``kvchaos engine serve`` flag) and the engine fingerprint."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from chaos import __version__
from chaos.engine.bugs import validate_bugs
from chaos.engine.model import ModelSpec


@dataclass
class EngineConfig:
    """Everything the engine needs; see ``chaos/engine/cli.py`` for the flag help.

    Attributes:
        model: model shape and seed.
        served_model_name: ``model`` reported by the API.
        num_blocks: blocks in the KV pool.
        block_size: tokens per block; must divide ``prefill_segment``.
        prefill_segment: canonical prefill segment (tokens); boundaries at its multiples.
            Must divide LMCache's chunk size (checked at connect).
        max_num_seqs: most requests running at once.
        enable_prefix_caching: the engine's own prefix cache (APC).
        kv_connector: ``lmcache-mp`` or ``none``.
        kv_role: ``kv_both`` (look up, load and store) or ``kv_producer`` (store only: never
            looks up or loads, so every token is computed; vLLM's ``KVTransferConfig.kv_role``
            names). A recompute twin in ``kv_producer`` role fills a witness LMCache with clean
            KV for diagnosis (chaos/diagnose).
        lmcache_url: LMCache server ZMQ address (``tcp://HOST:PORT``).
        kv_load_failure_policy: ``recompute`` (compute what failed to load) or ``fail``
            (the request fails with HTTP 500).
        lmcache_mq_timeout: seconds one LMCache MQ call may take.
        lmcache_heartbeat_interval: seconds between LMCache health pings.
        threads: torch intra-op threads (fixed: results must not depend on the machine).
        bugs: planted bug names (see ``bugs.py``).
        numerics: ``exact`` (bit-exact, the default) or ``batch-dependent`` (results depend on
            the batch size, as non-batch-invariant GPU kernels do; ``model.py``).
        batch_noise: relative size of the batch-dependent offset per layer.
    """

    model: ModelSpec = field(default_factory=ModelSpec)
    served_model_name: str = "kvchaos-ref"
    num_blocks: int = 1024
    block_size: int = 16
    prefill_segment: int = 256
    max_num_seqs: int = 16
    enable_prefix_caching: bool = False
    kv_connector: str = "none"
    kv_role: str = "kv_both"
    lmcache_url: str = "tcp://127.0.0.1:5555"
    kv_load_failure_policy: str = "recompute"
    lmcache_mq_timeout: float = 5.0
    lmcache_heartbeat_interval: float = 2.0
    threads: int = 1
    bugs: list[str] = field(default_factory=list)
    numerics: str = "exact"
    batch_noise: float = 1e-3

    def validate(self) -> None:
        """Check the settings.

        Raises:
            ValueError: with the offending flag named.
        """
        self.model.validate()
        self.bugs = validate_bugs(self.bugs)
        if self.kv_connector not in ("lmcache-mp", "none"):
            raise ValueError("--kv-connector must be lmcache-mp or none")
        if self.kv_role not in ("kv_both", "kv_producer"):
            raise ValueError("--kv-role must be kv_both or kv_producer")
        if self.kv_load_failure_policy not in ("recompute", "fail"):
            raise ValueError("--kv-load-failure-policy must be recompute or fail")
        if self.block_size < 1 or self.prefill_segment % self.block_size:
            raise ValueError("--block-size must divide --prefill-segment")
        if self.num_blocks < 2:
            raise ValueError("--num-blocks must be at least 2")
        if self.threads < 1:
            raise ValueError("--threads must be at least 1")
        if self.numerics not in ("exact", "batch-dependent"):
            raise ValueError("--numerics must be exact or batch-dependent")
        if not 0 < self.batch_noise < 0.1:
            raise ValueError("--batch-noise must be in (0, 0.1)")

    @property
    def fingerprint(self) -> str:
        """Hash of model config, dtype, seed, engine version, the numerics settings and the
        source of the modules that decide the output bits (so a code change never reuses
        recompute-oracle answers or LMCache entries computed by older code)."""
        extra = f"{self.prefill_segment}/{self.threads}/{_numerics_source_digest()}"
        if self.numerics != "exact":  # exact fingerprints stay what they were
            extra += f"/{self.numerics}/{self.batch_noise!r}"
        return self.model.fingerprint(f"{__version__}/{extra}")

    def to_dict(self) -> dict:
        """Plain-JSON view for ``/debug/state``."""
        return asdict(self)


def _numerics_source_digest() -> str:
    """sha256 (12 hex) over the engine modules whose code decides output bits."""
    import hashlib
    from pathlib import Path

    here = Path(__file__).parent
    h = hashlib.sha256()
    for name in ("model.py", "kv_pool.py", "tokenizer.py", "scheduler.py"):
        h.update((here / name).read_bytes())
    return h.hexdigest()[:12]
