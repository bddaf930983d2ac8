"""Test-only engine bugs in the load path after a correct retrieve (held-back classes: never in
chaos/engine/bugs.py, never in the zoo's planted list). The engine loads this file only when a
test sets ``KVCHAOS_ENGINE_TEST_PATCH`` to its path (chaos/engine/cli.py ``apply_test_patch``);
``KVCHAOS_TEST_LOAD_BUG`` picks the bug:

- ``zero:layer=L:plane=K|V``: after the retrieve, the K (or V) tensor of layer L of every loaded
  token is zeroed;
- ``previous-chunk:chunk=C``: after the retrieve, loaded chunk C's blocks are overwritten with
  chunk C-1's KV (C >= 1; default the last loaded chunk);
- ``report-one-less``: the engine loads (and trusts) the whole hit but reports one LMCache token
  less than it loaded (``external_cache_hit_tokens``).

``KVCHAOS_TEST_LOAD_BUG=@/path/file`` reads the bug from that file at each load instead (empty
file: none), so that tests of several bugs switch it between runs without restarting the engine.
"""

from __future__ import annotations

import os

ENV = "KVCHAOS_TEST_LOAD_BUG"


def parse(spec: str) -> tuple[str, dict[str, str]]:
    """``name:key=value:...`` -> ``(name, {key: value})``.

    Raises:
        ValueError: an unknown name or a malformed option.
    """
    name, *opts = spec.strip().split(":")
    if name not in ("zero", "previous-chunk", "report-one-less"):
        raise ValueError(f"{ENV}: unknown bug {name!r}")
    out: dict[str, str] = {}
    for o in opts:
        k, sep, v = o.partition("=")
        if not sep:
            raise ValueError(f"{ENV}: option {o!r} is not key=value")
        out[k] = v
    return name, out


def current(setting: str) -> tuple[str, dict[str, str]] | None:
    """The bug ``setting`` (``KVCHAOS_TEST_LOAD_BUG``'s value) names now: parsed from the value,
    or from the file an ``@path`` value names (read now); None when it names none.

    Raises:
        ValueError: an unknown name or a malformed option; OSError: the file cannot be read.
    """
    spec = setting.strip()
    if spec.startswith("@"):
        with open(spec[1:]) as f:
            spec = f.read().strip()
    return parse(spec) if spec else None


def install(core) -> None:
    """Wrap ``core._load_external`` with the bug ``KVCHAOS_TEST_LOAD_BUG`` names (no-op unset)."""
    setting = os.environ.get(ENV, "").strip()
    if not setting:
        return
    current(setting)  # a bad setting fails the engine's start, not a load
    original = core._load_external
    bs = core.config.block_size

    def load_external(req, local_hit: int) -> None:
        failed_before = req.load_failed_tokens
        original(req, local_hit)
        bug = current(setting)
        if bug is None:
            return
        name, opts = bug
        conn = core.connector
        hit = req.lookup_tokens if req.lookup_status == "hit" else 0
        if (conn is None or hit <= local_hit or req.load_failed_tokens != failed_before
                or req.num_computed < hit or getattr(req.phase, "name", "") != "RUNNING"):
            return  # nothing was loaded (or the load failed): the bug acts after a correct retrieve
        chunk = conn.chunk_size
        start = (local_hit // chunk) * chunk
        if name == "zero":
            layer, plane = int(opts.get("layer", "2")), {"K": 0, "V": 1}[opts.get("plane", "K")]
            blocks = req.block_table[local_hit // bs:hit // bs]
            core.pool.layers[layer][plane, blocks] = 0
        elif name == "previous-chunk":
            c = int(opts.get("chunk", str(hit // chunk - 1)))
            if c < 1 or c * chunk < start or (c + 1) * chunk > hit:
                return
            per = chunk // bs
            src = req.block_table[(c - 1) * per:c * per]
            dst = req.block_table[c * per:(c + 1) * per]
            for t in core.pool.layers:
                t[:, dst] = t[:, src]
        else:  # report-one-less
            req.local_hit_tokens = local_hit
            req.external_hit_tokens = req.num_computed - local_hit - 1
            req.stats_frozen = True

    core._load_external = load_external
