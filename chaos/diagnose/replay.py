"""A/B replays: the request's prompt sent again to the engine (cache on, cache bypassed) and to
the recompute twin, over the OpenAI-compatible ``/v1/completions`` (any vLLM-like engine).

Bypassing the cache without restarting anything: a ``cache_salt`` no request ever used. A
correct engine keys both its own prefix cache and LMCache with the salt (vLLM does), so nothing
can be reused; a hit under it is itself evidence that the key ignores the salt.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import httpx

from chaos.diagnose.model import Replay
from chaos.workload.classify import normalize_cache_stats
from chaos.workload.client import SAMPLING

TOP_K = 5
#: cache_salt prefix of the bypass replays (their entries are deleted after each diagnosis and
#: never listed as the run's).
BYPASS_PREFIX = "kvchaos-diagnose-bypass-"


def _token_id(label: str) -> int | None:
    """``token_id:N`` (vLLM's ``--return-tokens-as-token-ids`` spelling) -> N."""
    if isinstance(label, str) and label.startswith("token_id:"):
        try:
            return int(label.split(":", 1)[1])
        except ValueError:
            return None
    return None


def bypass_salt() -> str:
    """A cache_salt nobody used (LMCache allows up to 128 chars, no ``@ / \\``)."""
    return f"{BYPASS_PREFIX}{uuid.uuid4().hex[:12]}"


def read_completion(data: dict[str, Any], out: Replay) -> list[dict[int, float]]:
    """Fill ``out`` from a non-streamed ``/v1/completions`` answer (either engine's form).

    Returns:
        The top logprobs per output position as ``{token id: logprob}``.

    Raises:
        KeyError, IndexError, TypeError, ValueError: not a completions answer.
    """
    choice = data["choices"][0]
    out.token_ids = [int(t) for t in choice.get("token_ids") or []]
    stats = normalize_cache_stats(((data.get("kv_transfer_params") or {}).get("cached_token_stats")) or {})
    cached = ((data.get("usage") or {}).get("prompt_tokens_details") or {}).get("cached_tokens")
    if stats:
        out.local_hit_tokens = int(stats.get("local_cache_hit_tokens") or 0)
        out.external_hit_tokens = int(stats.get("external_cache_hit_tokens") or 0)
        out.load_failed_tokens = int(stats.get("load_failed_tokens") or 0)
        out.lookup = stats.get("lookup")
        if cached is not None and int(cached) > out.local_hit_tokens + out.external_hit_tokens:
            out.connector_external_tokens = out.external_hit_tokens
            out.external_hit_tokens = int(cached) - out.local_hit_tokens
    elif cached is not None:
        out.local_hit_tokens = int(cached)
    return [{tid: float(lp) for label, lp in (entry or {}).items() if (tid := _token_id(label)) is not None}
            for entry in ((choice.get("logprobs") or {}).get("top_logprobs") or [])]


def replay(base_url: str, kind: str, prompt: list[int], max_tokens: int, *, cache_salt: str | None = None,
           logprobs: int | None = None, request_id: str | None = None,
           timeout_s: float = 120.0, model: str = "kvchaos") -> tuple[Replay, list[dict[int, float]]]:
    """Send the prompt once (non-streamed, the workload's sampling: greedy, ignore_eos), in the
    workload's body (chaos.workload.client.CompletionClient.body): vLLM returns the generated
    token ids only with ``return_token_ids``, logprobs keyed by id only with
    ``return_tokens_as_token_ids``, and LMCache's connector its ``cached_token_stats`` only when
    ``kv_transfer_params`` asks (never asked of the twin, which has no connector).

    What the engine did not compute: the connector's stats (in the reference engine's names,
    chaos.workload.classify.normalize_cache_stats) say what LMCache loaded, but the engine's own
    count is ``usage.prompt_tokens_details.cached_tokens`` (vLLM: local + external tokens its
    scheduler counted as computed, with ``--enable-prompt-tokens-details``). Where the engine
    counted more than its stats (a connector that claims more than it loads),
    ``external_hit_tokens`` is the engine's count less the local hit and
    ``connector_external_tokens`` keeps the stats' figure.

    Args:
        base_url: engine or twin base URL.
        kind: ``fresh`` | ``bypass`` | ``twin`` (recorded; the twin is not asked for stats).
        prompt: prompt token ids; max_tokens: tokens to generate.
        cache_salt: sent when not None.
        logprobs: top-k logprobs to ask for (None: none).
        request_id: X-Request-Id (default ``kvchaos-diagnose-<kind>-<random>``).
        model: the ``model`` field (the stacks' served model name).

    Returns:
        ``(Replay, top_logprobs per output position as {token id: logprob})``; an HTTP or
        transport error is recorded in ``Replay.error``, never raised.
    """
    body: dict[str, Any] = {"model": model, "prompt": list(prompt), "max_tokens": max_tokens,
                            "return_token_ids": True, **SAMPLING}
    if cache_salt is not None:
        body["cache_salt"] = cache_salt
    if logprobs is not None:
        body["logprobs"] = logprobs
        body["return_tokens_as_token_ids"] = True
    if kind != "twin":
        body["kv_transfer_params"] = {"cached_token_stats": {}}
    rid = request_id or f"kvchaos-diagnose-{kind}-{uuid.uuid4().hex[:8]}"
    t0 = time.monotonic()
    out = Replay(kind=kind, cache_salt=cache_salt)  # type: ignore[arg-type]
    tops: list[dict[int, float]] = []
    try:
        r = httpx.post(f"{base_url.rstrip('/')}/v1/completions", json=body, headers={"X-Request-Id": rid},
                       timeout=timeout_s)
        if r.status_code != 200:
            out.error = f"HTTP {r.status_code}: {r.text[:200]}"
            return out, tops
        tops = read_completion(r.json(), out)
    except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError) as exc:
        out.error = f"{type(exc).__name__}: {exc}"
    finally:
        out.seconds = round(time.monotonic() - t0, 3)
    return out, tops


def reset_prefix_cache(base_url: str, timeout_s: float = 10.0) -> bool | None:
    """``POST /reset_prefix_cache`` (vLLM's route): True done, None when the engine has no
    such route, False on an error."""
    try:
        r = httpx.post(f"{base_url.rstrip('/')}/reset_prefix_cache", timeout=timeout_s)
    except httpx.HTTPError:
        return False
    if r.status_code == 404:
        return None
    return r.status_code < 300
