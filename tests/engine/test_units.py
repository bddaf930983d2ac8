"""Fast unit tests: tokenizer, block manager, bug registry, bit-exact canonical segments."""

from __future__ import annotations

import pytest
import torch

from chaos.engine.block_manager import BlockManager, block_hashes
from chaos.engine.bugs import BUGS, validate_bugs
from chaos.engine.kv_pool import KVPool
from chaos.engine.model import ModelSpec, PagedLlama
from chaos.engine.tokenizer import EOS_ID, ByteTokenizer

SPEC = ModelSpec(num_layers=2, hidden_size=128, num_heads=4, num_kv_heads=2,
                 intermediate_size=256)


def test_tokenizer_round_trip() -> None:
    tok = ByteTokenizer()
    text = "héllo, wörld ✓"
    ids = tok.encode(text)
    assert all(0 <= t < 256 for t in ids)
    assert tok.decode(ids) == text
    assert tok.decode(ids + [EOS_ID]) == text + "<|eos|>"


def test_block_manager_lru_and_prefix_cache() -> None:
    bm = BlockManager(8, 4, enable_prefix_caching=True)
    a = bm.allocate(3)
    assert a == [0, 1, 2] and bm.num_free == 5
    assert bm.allocate(6) is None and bm.num_free == 5
    hashes = block_hashes(list(range(12)), 4, 3, "salt")
    for b, h in zip(a, hashes):
        bm.register(b, h)
    bm.free(a)
    assert bm.num_free == 8
    # Same tokens and salt hit; another salt does not.
    assert bm.match_prefix(hashes) == a
    bm.free(a)
    assert bm.match_prefix(block_hashes(list(range(12)), 4, 3, "other")) == []
    # Allocating every block evicts the cached hashes.
    got = bm.allocate(8)
    assert got is not None and bm.num_cached == 0
    assert bm.match_prefix(hashes) == []
    with pytest.raises(RuntimeError):
        bm.free(got + [got[0]])


def test_bug_registry() -> None:
    assert validate_bugs(["drop-cache-salt", "drop-cache-salt"]) == ["drop-cache-salt"]
    with pytest.raises(ValueError, match="known"):
        validate_bugs(["no-such-bug"])
    assert len(BUGS) >= 7


def _prefill(model: PagedLlama, pool: KVPool, tokens: list[int], table: list[int],
             start: int, segment: int) -> torch.Tensor:
    pos, logits = start, None
    while pos < len(tokens):
        end = min(len(tokens), (pos // segment + 1) * segment)
        logits = model.forward(tokens[pos:end], pos, table, pool)
        pos = end
    assert logits is not None
    return logits


def test_loaded_prefix_is_bit_exact() -> None:
    """A 512-token hit loaded into other blocks gives max |Δlogit| = 0.0 (prefill + decode)."""
    torch.set_num_threads(1)
    model = PagedLlama(SPEC)
    pool = KVPool(2, 256, 16, 2, 32, torch.float32)
    gen = torch.Generator().manual_seed(3)
    prompt = torch.randint(0, 256, (700,), generator=gen).tolist()
    n_blocks = -(-(700 + 8) // 16)
    table_a = list(range(n_blocks))
    table_b = list(range(100, 100 + n_blocks))
    la = _prefill(model, pool, prompt, table_a, 0, 256)
    # "Load" 512 tokens (32 blocks) into table_b as LMCache would, then compute the rest.
    for layer in pool.layers:
        layer[:, table_b[:32]] = layer[:, table_a[:32]]
    lb = _prefill(model, pool, prompt, table_b, 512, 256)
    assert (la - lb).abs().max().item() == 0.0
    seq_a, seq_b = list(prompt), list(prompt)
    for _ in range(8):
        ta, tb = int(la.argmax()), int(lb.argmax())
        seq_a.append(ta)
        seq_b.append(tb)
        la = model.forward([ta], len(seq_a) - 1, table_a, pool)
        lb = model.forward([tb], len(seq_b) - 1, table_b, pool)
        assert (la - lb).abs().max().item() == 0.0
    assert seq_a == seq_b


def test_output_depends_on_distant_context() -> None:
    """Wrong KV at one early position changes the greedy output (the checks have teeth)."""
    torch.set_num_threads(1)
    model = PagedLlama(SPEC)
    pool = KVPool(2, 128, 16, 2, 32, torch.float32)
    gen = torch.Generator().manual_seed(5)
    prompt = torch.randint(0, 256, (600,), generator=gen).tolist()
    table = list(range(40))

    def generate(corrupt: bool) -> list[int]:
        logits = _prefill(model, pool, prompt, table, 0, 256)
        if corrupt:
            for layer in pool.layers:
                layer[:, table[3], 5] = 0.0
        out, seq = [], list(prompt)
        for _ in range(16):
            t = int(logits.argmax())
            out.append(t)
            seq.append(t)
            logits = model.forward([t], len(seq) - 1, table, pool)
        return out

    assert generate(False) != generate(True)


def test_weights_are_a_function_of_the_seed() -> None:
    a = PagedLlama(SPEC).model.state_dict()
    b = PagedLlama(SPEC).model.state_dict()
    c = PagedLlama(ModelSpec(**{**SPEC.__dict__, "seed": 1})).model.state_dict()
    key = "model.layers.0.self_attn.q_proj.weight"
    assert torch.equal(a[key], b[key]) and not torch.equal(a[key], c[key])
    assert SPEC.fingerprint("x") != ModelSpec(**{**SPEC.__dict__, "seed": 1}).fingerprint("x")


def test_bugs_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    from chaos.engine.cli import BUGS_ENV, bugs_from_environment

    monkeypatch.setenv(BUGS_ENV, "")
    assert bugs_from_environment() == []
    monkeypatch.setenv(BUGS_ENV, "drop-cache-salt, store-before-compute")
    assert bugs_from_environment() == ["drop-cache-salt", "store-before-compute"]
    monkeypatch.setenv(BUGS_ENV, "retry-failed-load-forever,repoll-timed-out-lookup,no-reconnect")
    assert validate_bugs(bugs_from_environment()) == [
        "no-reconnect", "repoll-timed-out-lookup", "retry-failed-load-forever"]


def test_fingerprint_follows_the_numerics_source(monkeypatch):
    """A change to the code that decides output bits changes the fingerprint, so the recompute
    oracle never serves answers computed by older engine code (stale answers gave false
    recompute failures during development)."""
    from chaos.engine import config as config_mod

    cfg = config_mod.EngineConfig()
    before = cfg.fingerprint
    monkeypatch.setattr(config_mod, "_numerics_source_digest", lambda: "changed-code")
    assert cfg.fingerprint != before


def test_batch_dependent_numerics_move_logits_a_little_and_exact_stays_exact() -> None:
    """--numerics batch-dependent: the same prompt in another batch gives other bits, off by a
    tiny fraction of the logits' spread (near-ties may flip, confident tokens do not); the same
    batch gives the same bits; the exact path (no batch key, or no noise) is bit-exact as before."""
    torch.set_num_threads(1)
    model = PagedLlama(SPEC)
    pool = KVPool(2, 256, 16, 2, 32, torch.float32)
    prompt = torch.randint(0, 256, (300,), generator=torch.Generator().manual_seed(5)).tolist()
    table = list(range(-(-300 // 16)))

    def logits(batch_key):
        pos, out = 0, None
        while pos < len(prompt):
            end = min(len(prompt), (pos // 256 + 1) * 256)
            out = model.forward(prompt[pos:end], pos, table, pool, batch_key)
            pos = end
        return out

    exact = logits(None)
    assert (logits(3) - exact).abs().max().item() == 0.0  # no noise configured: key ignored
    model.batch_noise = 2e-3
    assert (logits(None) - exact).abs().max().item() == 0.0  # no batch key: exact path
    b1, b3 = logits(1), logits(3)
    assert (logits(1) - b1).abs().max().item() == 0.0  # same batch, same bits
    moved = (b1 - b3).abs().max().item()
    assert 0.0 < moved < 0.05 * (exact.max() - exact.min()).item()


def test_numerics_settings_are_validated_and_fingerprinted() -> None:
    from chaos.engine.config import EngineConfig

    exact, noisy = EngineConfig(model=SPEC), EngineConfig(model=SPEC, numerics="batch-dependent")
    assert exact.fingerprint != noisy.fingerprint
    with pytest.raises(ValueError, match="--numerics"):
        EngineConfig(model=SPEC, numerics="fuzzy").validate()
