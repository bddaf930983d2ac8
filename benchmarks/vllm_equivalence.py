"""Is vLLM CPU bit-exact against its recompute twin across batch compositions? (issue 31)

On one compose/vllm-cpu.yml stack (vLLM with LMCache's MP connector, and the twin: vLLM without
connector and without prefix cache), ``--prompts`` greedy prompts (shared prefixes of lengths
around LMCache's 256-token chunk, distinct suffixes) are sent:

1. to the twin one at a time, twice: the reference answer, and whether the twin repeats itself;
2. for each concurrency in ``--batches``, in waves of that many at once, to the engine (the
   prefixes come from LMCache after their first store: vLLM's ``external_prefix_cache_hits``
   must grow) and to the twin.

Every answer carries the top-2 logprobs of each generated token (``return_tokens_as_token_ids``).
Printed per pass: requests whose token ids differ from the twin's lone answer, requests whose
logprobs differ at all, the largest logprob difference (nats), and the external hit tokens. A
pass with 0 token and 0 logprob differences is bit-exact: exact-mode ``recompute_equivalence``
holds there with no noise floor. Any difference means the tolerant mode (docs/scenarios.md) is
the one to run on this engine.

Bounded: every request 300 s; at most ``--prompts`` x (2 + 2 x len(``--batches``)) requests.
Needs the vLLM venv (``make setup-vllm`` or ``KVCHAOS_VLLM_PYTHON``); starts one vLLM stack
(about 7 GB), stopped on every exit (SIGINT/SIGTERM included).

    .venv/bin/python benchmarks/vllm_equivalence.py [--prompts 16] [--batches 1 4 16]
        [--max-tokens 24] [--json FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from chaos import interrupts  # noqa: E402
from chaos.prometheus import scrape_counters  # noqa: E402
from chaos.runner.stacks import StackPool  # noqa: E402
from chaos.workload.client import CompletionClient, CompletionOutcome, CompletionRequest  # noqa: E402

VLLM_STACK = REPO / "compose" / "vllm-cpu.yml"
EXTERNAL_HITS = "vllm:external_prefix_cache_hits_total"
VOCAB = 1000  # below the tiny model's vocabulary of 1,024 (chaos/vllm/model.py)
#: Shared prefix lengths in tokens: just under, at and over one 256-token LMCache chunk, and two.
PREFIX_LENGTHS = (255, 256, 300, 600)


def prompts(n: int, seed: int = 11) -> list[list[int]]:
    """``n`` prompts: ``len(PREFIX_LENGTHS)`` shared prefixes, each with suffixes of 8-40 tokens."""
    rng = random.Random(seed)
    prefixes = [[rng.randrange(VOCAB) for _ in range(k)] for k in PREFIX_LENGTHS]
    return [prefixes[i % len(prefixes)] + [rng.randrange(VOCAB) for _ in range(rng.randint(8, 40))]
            for i in range(n)]


async def _wave(client: CompletionClient, batch: list[tuple[int, list[int]]], max_tokens: int,
                tag: str) -> dict[int, CompletionOutcome]:
    reqs = [CompletionRequest(request_id=f"eq-{tag}-{i}", prompt_token_ids=p, max_tokens=max_tokens)
            for i, p in batch]
    outs = await asyncio.gather(*(client.complete(r, deadline_s=300) for r in reqs))
    return {i: o for (i, _), o in zip(batch, outs)}


async def answers(base: str, ps: list[list[int]], concurrency: int, max_tokens: int, tag: str,
                  cache_stats: bool) -> dict[int, CompletionOutcome]:
    """Every prompt's answer from the engine at ``base``, sent in waves of ``concurrency``."""
    out: dict[int, CompletionOutcome] = {}
    async with CompletionClient(base, logprobs=2, cache_stats=cache_stats) as client:
        indexed = list(enumerate(ps))
        for k in range(0, len(indexed), concurrency):
            out.update(await _wave(client, indexed[k:k + concurrency], max_tokens, f"{tag}-{k}"))
    bad = {i: o.error or o.type for i, o in out.items() if o.type != "ok"}
    if bad:
        raise RuntimeError(f"{tag}: requests did not complete: {bad}")
    return out


def compare(ref: dict[int, CompletionOutcome], got: dict[int, CompletionOutcome]) -> dict:
    """Token-id and logprob differences of ``got`` against ``ref``: counts of requests and the
    largest absolute logprob difference (nats) over the positions both answers share, and how
    many logprobs were compared (a token among both answers' top 2 at a position).

    Raises:
        RuntimeError: an answer has no logprob entry per generated token (it would compare
            nothing and look bit-exact).
    """
    token_diff, lp_diff, worst, compared = 0, 0, 0.0, 0
    for i, r in ref.items():
        g = got[i]
        if g.token_ids != r.token_ids:
            token_diff += 1
        if len(r.top_logprobs or []) != len(r.token_ids) or len(g.top_logprobs or []) != len(g.token_ids):
            raise RuntimeError(f"request {i}: an answer came without a logprob per generated token")
        d = 0.0
        for pos_r, pos_g in zip(r.top_logprobs or [], g.top_logprobs or []):
            gl = dict((int(t), lp) for t, lp in pos_g)
            for t, lp in pos_r:
                if int(t) in gl:
                    compared += 1
                    d = max(d, abs(lp - gl[int(t)]))
        if d > 0:
            lp_diff += 1
        worst = max(worst, d)
    return {"requests": len(ref), "token_ids_differ": token_diff, "logprobs_differ": lp_diff,
            "max_logprob_diff_nats": worst, "logprobs_compared": compared}


def external_hits(base: str) -> float:
    """vLLM's ``vllm:external_prefix_cache_hits_total`` (tokens)."""
    return scrape_counters(f"{base}/metrics", [EXTERNAL_HITS], timeout_s=30)[EXTERNAL_HITS] or 0.0


def measure(n: int, batches: list[int], max_tokens: int, root: Path) -> dict:
    """The passes above on one vLLM stack (stopped before returning)."""
    pool = StackPool("local", root / "stacks")
    try:
        stack = pool.acquire(VLLM_STACK, {})
        engine, twin = stack.settings.engine_url, stack.settings.recompute_url
        ps = prompts(n)
        ref = asyncio.run(answers(twin, ps, 1, max_tokens, "twin-alone", False))
        again = asyncio.run(answers(twin, ps, 1, max_tokens, "twin-alone-again", False))
        rows = [{"pass": "twin alone, again", "concurrency": 1, **compare(ref, again), "external_hit_tokens": 0}]
        for b in batches:
            before = external_hits(engine)
            got = asyncio.run(answers(engine, ps, b, max_tokens, f"engine-{b}", True))
            rows.append({"pass": "engine (LMCache)", "concurrency": b, **compare(ref, got),
                         "external_hit_tokens": external_hits(engine) - before})
            got = asyncio.run(answers(twin, ps, b, max_tokens, f"twin-{b}", False))
            rows.append({"pass": "twin", "concurrency": b, **compare(ref, got), "external_hit_tokens": 0})
        return {"prompts": n, "max_tokens": max_tokens, "prefix_lengths": list(PREFIX_LENGTHS), "rows": rows}
    finally:
        pool.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 4, 16])
    ap.add_argument("--max-tokens", type=int, default=24)
    ap.add_argument("--json", type=Path, default=None, help="also write the figures here")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="kvchaos-bench-eq-") as tmp:
        figs = measure(args.prompts, args.batches, args.max_tokens, Path(tmp))
    print(f"{args.prompts} prompts (prefixes {', '.join(map(str, PREFIX_LENGTHS))} tokens), "
          f"{args.max_tokens} greedy tokens each, against the twin's lone answers:")
    print(f"{'pass':<20} {'concurrency':>11} {'token ids differ':>17} {'logprobs differ':>16} "
          f"{'max |dlogprob|':>15} {'logprobs compared':>18} {'external hits':>14}")
    for r in figs["rows"]:
        print(f"{r['pass']:<20} {r['concurrency']:>11} {r['token_ids_differ']:>10} of {r['requests']:<4}"
              f"{r['logprobs_differ']:>10} of {r['requests']:<4} {r['max_logprob_diff_nats']:>15.3g} "
              f"{r['logprobs_compared']:>18} "
              f"{r['external_hit_tokens']:>14.0f}")
    exact = all(r["token_ids_differ"] == 0 and r["logprobs_differ"] == 0 for r in figs["rows"])
    print("bit-exact in every pass" if exact else "NOT bit-exact: run recompute_equivalence in tolerant mode here")
    if args.json:
        args.json.write_text(json.dumps(figs, indent=2))
    return 0


if __name__ == "__main__":
    interrupts.script_exit(main, "vllm_equivalence")
