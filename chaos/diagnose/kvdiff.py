"""Served KV against witness KV, chunk by chunk and layer by layer (pure functions).

Triage step 3: "max |cached - recomputed| and the share of zeros in the cached tensor. Large
diff or many zeros: the entry is corrupt. Zero diff: the KV is right and the fault is in
length, mask or sampling." A chunk is ``[2, num_layers, chunk_size, hidden_dim]`` (K, V).

Kinds of a differing chunk:
- ``zero``: at least half of the served values, of the whole chunk or of the layers' K or V
  planes that differ, are exactly 0 where the witness's are not (an empty buffer was stored or
  read, or one layer's K or V was zeroed);
- ``corrupt``: non-finite values, or magnitudes far beyond the witness's (bytes that are not KV);
- ``stale``: plausible KV, but not this prefix's (another request's blocks, an older entry, or
  KV computed over a wrong context: then layer 0, which depends only on the tokens, still
  matches and the first bad layer is later).
"""

from __future__ import annotations

import hashlib

from chaos.diagnose.model import ChunkDiff, LayerDiff

#: served |max| above this many times the witness's |max| is not KV any more.
CORRUPT_MAGNITUDE = 8.0
ZERO_SHARE = 0.5


def checksum(t) -> str:
    """sha256 of a tensor's bytes, 12 hex digits."""
    return hashlib.sha256(t.contiguous().numpy().tobytes()).hexdigest()[:12]


def _zero_share(t) -> float:
    return float((t == 0).float().mean()) if t.numel() else 0.0


def compare_chunk(served, witness, *, chunk: int, start: int, chunk_hash: str, tolerance: float = 0.0) -> ChunkDiff:
    """Compare one chunk's served KV with the witness's.

    Args:
        served, witness: tensors ``[2, num_layers, chunk_size, hidden_dim]`` (same shape).
        chunk: chunk index in the prompt; start: its first token position.
        chunk_hash: its LMCache chunk hash (hex), for the report.
        tolerance: largest |delta| still counted equal, relative to the witness's max |value|
            (0: bit-exact, as the reference engine is).

    Returns:
        The :class:`ChunkDiff` (``equal``, ``kind``, first bad layer and position).

    Raises:
        ValueError: the shapes differ.
    """
    import torch

    if served.shape != witness.shape:
        raise ValueError(f"served KV {tuple(served.shape)} and witness KV {tuple(witness.shape)} differ in shape")
    s, w = served.float(), witness.float()
    wmax = float(w.abs().max()) if w.numel() else 0.0
    tol = tolerance * wmax
    finite = bool(torch.isfinite(s).all())
    delta = (s - w).abs()
    if not finite:
        delta = torch.where(torch.isfinite(delta), delta, torch.full_like(delta, float("inf")))
    layers: list[LayerDiff] = []
    first_layer = first_pos = None
    for li in range(s.shape[1]):
        d = delta[:, li]  # [2, T, H]
        bad = d > tol
        pos = plane = None
        planes = [name for i, name in enumerate(("K", "V")) if bool(bad[i].any())]
        if bool(bad.any()):
            rows = bad.any(dim=2)  # [2, T]
            by_pos = rows.any(dim=0)
            t = int(torch.nonzero(by_pos)[0])
            pos = start + t
            plane = "K" if bool(rows[0, t]) else "V"
            if first_layer is None:
                first_layer, first_pos = li, pos
        layers.append(LayerDiff(layer=li, max_abs_delta=float(d.max()) if d.numel() else 0.0,
                                zero_share=round(_zero_share(s[:, li]), 6), served_checksum=checksum(served[:, li]),
                                witness_checksum=checksum(witness[:, li]), first_position=pos, plane=plane,
                                planes=planes))
    equal = first_layer is None
    zero_share, witness_zero = _zero_share(s), _zero_share(w)
    kind = None
    if not equal:
        smax = float(s[torch.isfinite(s)].abs().max()) if finite or bool(torch.isfinite(s).any()) else 0.0
        # zeros judged where it differs (a load that zeroes one layer's K is "zero" there)
        idx = [(li, p) for li, x in enumerate(layers) for p, name in enumerate(("K", "V")) if name in x.planes]
        bad_s = torch.stack([s[p, li] for li, p in idx]) if idx else s
        bad_w = torch.stack([w[p, li] for li, p in idx]) if idx else w
        if (zero_share >= ZERO_SHARE and witness_zero < ZERO_SHARE) or (
                _zero_share(bad_s) >= ZERO_SHARE and _zero_share(bad_w) < ZERO_SHARE):
            kind = "zero"
        elif not finite or smax > CORRUPT_MAGNITUDE * max(wmax, 1e-30):
            kind = "corrupt"
        else:
            kind = "stale"
    out = ChunkDiff(chunk=chunk, start=start, end=start + s.shape[2], chunk_hash=chunk_hash, equal=equal, kind=kind,
                     max_abs_delta=float(delta.max()) if delta.numel() else 0.0, zero_share=round(zero_share, 6),
                     witness_zero_share=round(witness_zero, 6), served_checksum=checksum(served),
                     witness_checksum=checksum(witness), first_bad_layer=first_layer, first_bad_position=first_pos,
                     layers=layers)
    out.bad_where = out.bad_layers()
    return out


def equal_within(a, b, tolerance: float = 0.0) -> bool:
    """``a`` equals ``b`` elementwise within ``tolerance`` x max |b| (same shape required)."""
    if a.shape != b.shape:
        return False
    bf = b.float()
    tol = tolerance * (float(bf.abs().max()) if bf.numel() else 0.0)
    return bool(((a.float() - bf).abs() <= tol).all())


def duplicate_chunks(served) -> list[tuple[int, int]]:
    """Chunks of one prompt whose KV is bit-identical to an earlier chunk's, a check that needs no
    witness: under rotary position embedding the cached keys carry their positions, so the KV of
    two different positions is never equal, whatever the tokens (the same token at another
    position has another key); an engine or store that wrote one chunk's KV under another's key
    leaves such a pair.

    Args:
        served: ``[chunks, 2, num_layers, chunk_size, hidden_dim]`` (LMCache's copy of a prompt).

    Returns:
        ``[(chunk, earlier chunk it equals)]``, in chunk order, each chunk at most once.
    """
    import torch

    out: list[tuple[int, int]] = []
    for j in range(1, served.shape[0]):
        i = next((i for i in range(j) if torch.equal(served[j], served[i])), None)
        if i is not None:
            out.append((j, i))
    return out


def compare_engine_kv(engine_kv, witness, *, chunk_size: int, loaded: tuple[int, int], hashes: list[str],
                      tolerance: float = 0.0):
    """The KV an engine attends over against the witness's, chunk by chunk.

    Args:
        engine_kv: ``[2, num_layers, prompt_tokens, hidden_dim]`` (the engine's blocks, K then V).
        witness: ``[chunks, 2, num_layers, chunk_size, hidden_dim]`` (the clean twin's chunks).
        chunk_size: tokens per chunk; loaded: ``[start, end)`` tokens the engine took from
            LMCache; hashes: chunk hashes (hex) for the report.
        tolerance: as :func:`compare_chunk`.

    Returns:
        ``(chunks, bad_in_loaded, bad_after)``: a :class:`ChunkDiff` per full chunk both cover
        (``same_as_chunk`` set when a differing chunk equals another chunk's witness), the
        indices of differing chunks inside ``loaded`` and past it.

    Raises:
        ValueError: layer or width differ between the two.
    """
    if engine_kv.shape[:2] != witness.shape[1:3] or engine_kv.shape[3] != witness.shape[4]:
        raise ValueError(f"engine KV {tuple(engine_kv.shape)} and witness chunks {tuple(witness.shape)} "
                         "differ in layout")
    n = min(engine_kv.shape[2] // chunk_size, witness.shape[0])
    out, bad_in, bad_after = [], [], []
    for i in range(n):
        mine = engine_kv[:, :, i * chunk_size:(i + 1) * chunk_size]
        d = compare_chunk(mine, witness[i], chunk=i, start=i * chunk_size,
                          chunk_hash=hashes[i] if i < len(hashes) else "", tolerance=tolerance)
        if not d.equal:
            d.same_as_chunk = next((j for j in range(witness.shape[0])
                                    if j != i and equal_within(mine, witness[j], tolerance)), None)
            if i * chunk_size < loaded[1] and (i + 1) * chunk_size > loaded[0]:
                bad_in.append(i)
            else:
                bad_after.append(i)
        out.append(d)
    return out, bad_in, bad_after
