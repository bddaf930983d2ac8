"""The recompute oracle: what each request's output must be, from the stack's recompute twin.

The twin is the same engine (same model, dtype, seed) with the KV connector off and the local
prefix cache off, so every token it produces was computed from scratch. Greedy decoding makes
its output a function of (engine fingerprint, prompt token ids, max_tokens); a cache_salt does
not change what a correct engine computes, only which cache entries it may reuse.

Answers are kept on disk (SQLite, one file per engine fingerprint) under
``$KVCHAOS_ORACLE_DIR`` (default ``~/.cache/kvchaos/oracle``) and reused across runs, so a
rerun of a suite asks the twin only for prompts it never saw.

For engines that are not bit-exact (recompute_equivalence's tolerant mode) the twin is also
asked for the top-2 logprobs of every token it generated (stored next to the token ids), and
:meth:`RecomputeOracle.replay` asks it every prompt again, one at a time and never from the
store: the twin against itself, the noise floor of the run (as LMCache's preemption
correctness test measures its "A/A noise floor": ``.buildkite/k3_tests/multiprocess/scripts/
preemption_correctness.py``).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import sqlite3
import threading
from collections.abc import Iterable
from pathlib import Path

import httpx

from chaos.httppool import ssl_context
from chaos.history import Op
from chaos.interrupts import run_async  # a signal cancels the questions in flight
from chaos.workload.client import SAMPLING, CompletionClient, CompletionRequest


#: Alternatives asked per generated token in tolerant mode: the margin rule needs the top two.
TOP_K = 2


class OracleError(RuntimeError):
    """The recompute twin could not answer (unreachable, HTTP error, no fingerprint)."""


def oracle_dir() -> Path:
    """Where oracle databases live; created on demand."""
    d = Path(os.environ.get("KVCHAOS_ORACLE_DIR") or Path.home() / ".cache" / "kvchaos" / "oracle")
    d.mkdir(parents=True, exist_ok=True)
    return d


def engine_fingerprint(base_url: str, timeout_s: float = 10.0) -> str:
    """The engine's fingerprint (model config, dtype, seed, engine version), from
    ``GET /debug/state`` of the reference engine, else ``GET /v1/models`` (the model id).

    Raises:
        OracleError: neither answers.
    """
    base = base_url.rstrip("/")
    try:
        r = httpx.get(f"{base}/debug/state", timeout=timeout_s, verify=ssl_context())
        if r.status_code == 200 and r.json().get("fingerprint"):
            return str(r.json()["fingerprint"])
        r = httpx.get(f"{base}/v1/models", timeout=timeout_s, verify=ssl_context())
        r.raise_for_status()
        data = r.json()["data"][0]
        return "model-" + hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]
    except (httpx.HTTPError, KeyError, IndexError, ValueError) as exc:
        raise OracleError(f"cannot read the fingerprint of the recompute twin at {base}: {exc}") from exc


def request_key(prompt_token_ids: list[int], max_tokens: int) -> str:
    """Oracle key of one request: sha256 over the prompt ids, max_tokens and the sampling
    parameters every request carries (``chaos.workload.client.SAMPLING``), so answers stored
    under other parameters are never reused."""
    material = [max_tokens, prompt_token_ids, sorted(SAMPLING.items())]
    return hashlib.sha256(json.dumps(material, separators=(",", ":")).encode()).hexdigest()


class RecomputeOracle:
    """Expected outputs from the recompute twin, cached on disk per engine fingerprint.

    Args:
        recompute_url: base URL of the recompute twin.
        fingerprint: the engine fingerprint; read from the twin when None.
        directory: where the SQLite files live (``oracle_dir()`` when None).
        concurrency: requests sent to the twin at once.
        request_timeout_s: deadline of one twin request (s).
    """

    def __init__(self, recompute_url: str, *, fingerprint: str | None = None, directory: Path | None = None,
                 concurrency: int = 4, request_timeout_s: float = 300.0) -> None:
        self.url = recompute_url.rstrip("/")
        self.fingerprint = fingerprint or engine_fingerprint(self.url)
        folder = Path(directory) if directory is not None else oracle_dir()
        folder.mkdir(parents=True, exist_ok=True)
        self.path = folder / f"{self.fingerprint}.sqlite"
        self.concurrency = concurrency
        self.request_timeout_s = request_timeout_s
        self._lock = threading.Lock()
        self._db = sqlite3.connect(self.path, check_same_thread=False)
        self._db.execute("CREATE TABLE IF NOT EXISTS expected (key TEXT PRIMARY KEY, token_ids TEXT NOT NULL)")
        self._db.execute("CREATE TABLE IF NOT EXISTS top_logprobs (key TEXT PRIMARY KEY, top TEXT NOT NULL)")
        self._db.commit()
        self.hits = 0
        self.misses = 0

    def close(self) -> None:
        """Close the database."""
        self._db.close()

    def cached(self, prompt_token_ids: list[int], max_tokens: int) -> list[int] | None:
        """The stored answer for a request, or None."""
        with self._lock:
            row = self._db.execute("SELECT token_ids FROM expected WHERE key = ?",
                                   (request_key(prompt_token_ids, max_tokens),)).fetchone()
        return json.loads(row[0]) if row else None

    def cached_top_logprobs(self, prompt_token_ids: list[int], max_tokens: int) -> list | None:
        """The stored top-2 logprobs (per token, ``[[id, lp], [id, lp]]``) for a request, or None."""
        with self._lock:
            row = self._db.execute("SELECT top FROM top_logprobs WHERE key = ?",
                                   (request_key(prompt_token_ids, max_tokens),)).fetchone()
        return json.loads(row[0]) if row else None

    def _store(self, prompt_token_ids: list[int], max_tokens: int, token_ids: list[int],
               top: list | None = None) -> None:
        key = request_key(prompt_token_ids, max_tokens)
        with self._lock:
            self._db.execute("INSERT OR REPLACE INTO expected VALUES (?, ?)", (key, json.dumps(token_ids)))
            if top is not None:
                self._db.execute("INSERT OR REPLACE INTO top_logprobs VALUES (?, ?)", (key, json.dumps(top)))
            self._db.commit()

    async def _ask(self, reqs: list[CompletionRequest], *, logprobs: bool = False,
                   concurrency: int | None = None) -> dict[str, tuple[list[int], list | None]]:
        out: dict[str, tuple[list[int], list | None]] = {}
        sem = asyncio.Semaphore(concurrency or self.concurrency)
        async with CompletionClient(self.url, history=None, logprobs=TOP_K if logprobs else None) as client:
            async def one(req: CompletionRequest) -> None:
                async with sem:
                    res = await client.complete(req, deadline_s=self.request_timeout_s)
                if res.type != "ok":
                    raise OracleError(f"recompute twin failed request {req.request_id}: "
                                      f"{res.error or res.type} (status {res.status})")
                top = res.top_logprobs if logprobs else None
                if logprobs and (top is None or len(top) != len(res.token_ids)):
                    raise OracleError(f"recompute twin returned no top-{TOP_K} logprobs for "
                                      f"{req.request_id} (does it support logprobs and "
                                      "return_tokens_as_token_ids?)")
                out[req.request_id] = (res.token_ids, top)
            await asyncio.gather(*(one(r) for r in reqs))
        return out

    @staticmethod
    def _completed(history: Iterable[Op]) -> dict[str, tuple[list[int], int]]:
        """``{request_id: (prompt ids, max_tokens)}`` of every request that completed (ok)."""
        ops = list(history)
        done = {op.request_id for op in ops if op.f == "complete" and op.type == "ok"}
        out = {}
        for op in ops:
            if op.f == "complete" and op.type == "invoke" and op.request_id in done:
                prompt, max_tokens = op.value.get("prompt_token_ids"), op.value.get("max_tokens")
                if prompt is not None and max_tokens is not None:
                    out[op.request_id] = (prompt, max_tokens)
        return out

    def expected_for(self, history: Iterable[Op]) -> dict[str, list[int]]:
        """Expected token ids for every request the history shows completed (``ok``).

        The prompt and max_tokens come from each request's ``invoke`` value
        (``prompt_token_ids``, ``max_tokens``). Requests not in the store are sent to the twin
        (non-streamed, no cache_salt) and stored.

        Returns:
            ``{request_id: token_ids}``.

        Raises:
            OracleError: the twin failed a request.
        """
        return self._expected(history, logprobs=False)[0]

    def expected_with_logprobs(self, history: Iterable[Op]) -> tuple[dict[str, list[int]], dict[str, list]]:
        """Like :meth:`expected_for`, plus the twin's top-2 logprobs of every expected token.

        Returns:
            ``({request_id: token_ids}, {request_id: [[[id, lp], [id, lp]] per token]})``.

        Raises:
            OracleError: the twin failed a request or returned no logprobs.
        """
        return self._expected(history, logprobs=True)

    def _expected(self, history: Iterable[Op], *, logprobs: bool) -> tuple[dict[str, list[int]], dict[str, list]]:
        expected: dict[str, list[int]] = {}
        tops: dict[str, list] = {}
        ask: dict[str, CompletionRequest] = {}
        waiting: dict[str, list[str]] = {}
        for rid, (prompt, max_tokens) in self._completed(history).items():
            hit = self.cached(prompt, max_tokens)
            top = self.cached_top_logprobs(prompt, max_tokens) if logprobs else None
            if hit is not None and (top is not None or not logprobs):
                self.hits += 1
                expected[rid] = hit
                if top is not None:
                    tops[rid] = top
                continue
            key = request_key(prompt, max_tokens)
            waiting.setdefault(key, []).append(rid)
            if key not in ask:
                self.misses += 1
                ask[key] = CompletionRequest(request_id=f"oracle-{key[:12]}", prompt_token_ids=prompt,
                                             max_tokens=max_tokens)
        if ask:
            answers = run_async(self._ask(list(ask.values()), logprobs=logprobs))
            for key, req in ask.items():
                ids, top = answers[req.request_id]
                self._store(req.prompt_token_ids, req.max_tokens, ids, top)
                for rid in waiting[key]:
                    expected[rid] = ids
                    if top is not None:
                        tops[rid] = top
        return expected, tops

    def replay(self, history: Iterable[Op], *, concurrency: int = 1) -> tuple[dict[str, list[int]], dict[str, list]]:
        """Ask the twin every completed request's prompt again, ``concurrency`` at a time, never
        from the store: the twin against itself (the noise floor of an engine that is not
        bit-exact: its batches now differ from those of the first answers).

        Returns:
            ``({request_id: token_ids}, {request_id: top-2 logprobs})`` for one request id per
            distinct prompt (the first completed one).

        Raises:
            OracleError: the twin failed a request or returned no logprobs.
        """
        ask: dict[str, tuple[str, CompletionRequest]] = {}
        for rid, (prompt, max_tokens) in self._completed(history).items():
            key = request_key(prompt, max_tokens)
            if key not in ask:
                ask[key] = (rid, CompletionRequest(request_id=f"replay-{key[:12]}", prompt_token_ids=prompt,
                                                   max_tokens=max_tokens))
        if not ask:
            return {}, {}
        answers = run_async(self._ask([r for _, r in ask.values()], logprobs=True, concurrency=concurrency))
        tokens = {rid: answers[req.request_id][0] for rid, req in ask.values()}
        tops = {rid: answers[req.request_id][1] or [] for rid, req in ask.values()}
        return tokens, tops
