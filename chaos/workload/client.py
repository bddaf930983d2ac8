"""An async client of the engine's OpenAI-compatible ``/v1/completions`` that writes the history.

    invoke ──POST /v1/completions (X-Request-Id)──> engine
      │          stream: SSE, one token per event ──> ttft_s, itl_s
      └─> ok (token ids, cached_token_stats, usage) | fail (HTTP error) | info (deadline,
          connection lost mid-answer, or aborted on purpose by a Cancel)

``fail`` means the engine answered with an error (the request definitely ended);
``info`` means indeterminate: we stopped waiting or the connection broke mid-answer.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from typing import Any

import httpx
from pydantic import BaseModel, ConfigDict, Field

from chaos.history import HistoryWriter, Op
from chaos.httppool import pool_limits, ssl_context
from chaos.workload.generator import prompt_hash

__all__ = ["CompletionRequest", "Cancel", "CompletionClient", "CompletionOutcome", "parse_top_logprobs"]


#: Sampling parameters of every request: greedy, and max_tokens tokens however early a
#: (random-weight) model says EOS, so a wrong KV position has room to show in the output.
#: The recompute oracle keys its stored answers on them too.
SAMPLING: dict[str, Any] = {"temperature": 0, "ignore_eos": True}


class CompletionRequest(BaseModel):
    """A request to send, with the workload labels recorded in the history."""

    model_config = ConfigDict(extra="forbid")

    request_id: str
    prompt_token_ids: list[int]
    max_tokens: int = Field(ge=1)
    stream: bool = False
    cache_salt: str | None = None
    family: int | None = None
    tenant: str | None = None
    conversation: int | None = None
    turn: int | None = None
    prefix_len: int | None = None


@dataclass(frozen=True)
class Cancel:
    """Abort a request on purpose (the client closes the connection; the engine must abort).

    ``after_first_token``: abort as soon as the first token arrives (streamed requests; a
    non-streamed request has no first token, so ``after_ms`` must be set for it).
    ``after_ms``: abort this many milliseconds after sending, if not done by then.
    ``at_state``: abort once the engine says the request entered this stage (``lookup``,
    ``load``, ``prefill``, ``decode``; the reference engine's ``GET /debug/requests/{id}
    ?wait_for=STAGE``), then read back the stage the abort landed in. On an engine without that
    endpoint the request is not aborted and the outcome says why.
    """

    after_first_token: bool = False
    after_ms: float | None = None
    at_state: str | None = None
    #: after a timed abort (first token, ``after_ms``), ask the engine where it landed, as for
    #: ``at_state`` (``outcome.cancel``: ``{"timed": True, "reached": True, "landed_in", ...}``)
    report_landing: bool = False


#: How long to wait for an engine's stage watch to answer its first line, and for the engine to
#: record where an abort landed (its HTTP layer notices a closed connection within ~0.1 s).
STATE_WATCH_START_S = 5.0
ABORT_LANDING_S = 3.0


class CompletionOutcome(BaseModel):
    """What the client saw; the same data as the ok/fail/info op's value."""

    model_config = ConfigDict(extra="forbid")

    type: str  # ok | fail | info
    token_ids: list[int] = Field(default_factory=list)
    text: str = ""
    finish_reason: str | None = None
    ttft_s: float | None = None
    itl_s: list[float] = Field(default_factory=list)
    latency_s: float = 0.0
    cached_token_stats: dict[str, Any] | None = None
    usage: dict[str, Any] | None = None
    status: int | None = None
    error: str | None = None
    aborted: bool = False
    prompt_len: int = 0
    #: For a cancel aimed at a stage: ``{"at_state", "reached", "entered", "landed_in",
    #: "handled_in", "reason"}`` (landed_in: the engine's stage when the abort reached it).
    cancel: dict[str, Any] | None = None
    top_logprobs: list[list[list[float]]] | None = Field(
        default=None,
        description="per generated token, the top-k alternatives as [token id, logprob] pairs, "
        "best first; only when the client asked for logprobs")


def parse_top_logprobs(entries: Any) -> list[list[list[float]]]:
    """``[[token_id, logprob], ...]`` per position (best first) from an OpenAI completions
    ``logprobs.top_logprobs`` list whose keys are ``token_id:N`` (vLLM's
    ``return_tokens_as_token_ids``; the reference engine always spells them so). A key that is
    not ``token_id:N`` is dropped (its id is unknown).
    """
    out: list[list[list[float]]] = []
    for entry in entries or []:
        pairs = []
        for key, lp in (entry or {}).items():
            if isinstance(key, str) and key.startswith("token_id:") and key[9:].lstrip("-").isdigit():
                pairs.append([int(key[9:]), float(lp)])
        pairs.sort(key=lambda p: -p[1])
        out.append(pairs)
    return out


class _Abort(Exception):
    """Raised inside the stream reader when a Cancel fires."""


class CompletionClient:
    """Sends completions to one engine and records each on the history.

    Args:
        base_url: the engine, e.g. ``http://127.0.0.1:8100``.
        history: where invoke/ok/fail/info ops go; None records nothing.
        model: the ``model`` field sent (the reference engine ignores it).
        connect_timeout_s: TCP connect timeout, seconds.
        client: an httpx.AsyncClient to use (tests); default one per CompletionClient.
        logprobs: ask for the top-``logprobs`` alternatives of every generated token (with
            ``return_tokens_as_token_ids``, so they come back as ids); None asks for none.
        cache_stats: ask the engine for its per-request cache accounting
            (``kv_transfer_params: {"cached_token_stats": {}}``: LMCache's MP connector answers
            only when asked, ``LMCacheMPConnector.request_finished``); off for a recompute twin,
            which has no connector.
    """

    def __init__(
        self,
        base_url: str,
        *,
        history: HistoryWriter | None = None,
        model: str = "kvchaos",
        connect_timeout_s: float = 5.0,
        client: httpx.AsyncClient | None = None,
        logprobs: int | None = None,
        cache_stats: bool = False,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.logprobs = logprobs
        self.cache_stats = cache_stats
        self.history = history
        self.model = model
        self._client = client or httpx.AsyncClient(
            timeout=httpx.Timeout(None, connect=connect_timeout_s),
            limits=pool_limits(max_connections=None, max_keepalive_connections=64),
            verify=ssl_context(),
        )
        self._own_client = client is None

    async def aclose(self) -> None:
        """Close the HTTP connection pool (if this client created it)."""
        if self._own_client:
            await self._client.aclose()

    async def __aenter__(self) -> CompletionClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def body(self, req: CompletionRequest) -> dict[str, Any]:
        """The JSON body sent for ``req`` (docs/architecture.md section 2)."""
        body: dict[str, Any] = {
            "model": self.model,
            "prompt": req.prompt_token_ids,
            "max_tokens": req.max_tokens,
            "stream": req.stream,
            # vLLM (>= 0.10.2) and SGLang return the generated token ids only when asked.
            "return_token_ids": True,
            **SAMPLING,
        }
        if req.cache_salt is not None:
            body["cache_salt"] = req.cache_salt
        if self.logprobs is not None:
            body["logprobs"] = self.logprobs
            body["return_tokens_as_token_ids"] = True
        if self.cache_stats:
            body["kv_transfer_params"] = {"cached_token_stats": {}}
        return body

    def _record(self, type_: str, req: CompletionRequest, process: str, phase: str, value: dict) -> Op | None:
        if self.history is None:
            return None
        return self.history.append(
            process, type_, "complete", phase=phase, request_id=req.request_id, value=value  # type: ignore[arg-type]
        )

    async def complete(
        self,
        req: CompletionRequest,
        *,
        process: str = "client-0",
        phase: str = "",
        deadline_s: float | None = None,
        cancel: Cancel | None = None,
    ) -> CompletionOutcome:
        """Send one completion, recording invoke then ok/fail/info.

        Args:
            req: the request.
            process: history process name (``client-N``).
            phase: phase name for the history.
            deadline_s: give up after this many seconds (recorded as ``info``, error
                "deadline exceeded"); None waits forever.
            cancel: abort on purpose (recorded as ``info`` with ``aborted: true``).

        Returns:
            The outcome (also recorded). Never raises for engine or network errors; raises
            only on cancellation of the calling task (after recording ``info``).
        """
        self._record(
            "invoke",
            req,
            process,
            phase,
            {
                "prompt_token_ids": req.prompt_token_ids,
                "prompt_hash": prompt_hash(req.prompt_token_ids),
                "prompt_len": len(req.prompt_token_ids),
                "prefix_len": req.prefix_len,
                "family": req.family,
                "tenant": req.tenant,
                "cache_salt": req.cache_salt,
                "conversation": req.conversation,
                "turn": req.turn,
                "stream": req.stream,
                "max_tokens": req.max_tokens,
            },
        )
        t0 = time.monotonic()
        state = _Progress(t0)
        if cancel is not None and cancel.at_state is not None:
            try:
                outcome = await self._complete_at_state(req, state, cancel.at_state, deadline_s)
            except asyncio.CancelledError:
                outcome = state.outcome("info", aborted=True, error="cancelled by the runner")
                outcome.prompt_len = len(req.prompt_token_ids)
                self._record("info", req, process, phase, outcome.model_dump())
                raise
            outcome.prompt_len = len(req.prompt_token_ids)
            self._record(outcome.type, req, process, phase, outcome.model_dump())
            return outcome
        limits = [x for x in (deadline_s, (cancel.after_ms / 1000.0) if cancel and cancel.after_ms is not None else None) if x is not None]
        wait_s = min(limits) if limits else None
        by_cancel = cancel is not None and cancel.after_ms is not None and (
            deadline_s is None or cancel.after_ms / 1000.0 <= deadline_s
        )
        try:
            if wait_s is None:
                outcome = await self._send(req, state, cancel)
            else:
                outcome = await asyncio.wait_for(self._send(req, state, cancel), wait_s)
        except asyncio.TimeoutError:
            outcome = state.outcome(
                "info",
                aborted=by_cancel,
                error="aborted by client after %g ms" % cancel.after_ms if by_cancel and cancel else "deadline exceeded",
            )
            if by_cancel and cancel is not None and cancel.report_landing:
                outcome.cancel = await self._timed_landing(req)
        except _Abort:
            outcome = state.outcome("info", aborted=True, error="aborted by client after the first token")
            if cancel is not None and cancel.report_landing:
                outcome.cancel = await self._timed_landing(req)
        except asyncio.CancelledError:
            outcome = state.outcome("info", aborted=True, error="cancelled by the runner")
            outcome.prompt_len = len(req.prompt_token_ids)
            self._record("info", req, process, phase, outcome.model_dump())
            raise
        except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
            outcome = state.outcome("fail", error=f"connect: {exc!r}")
        except httpx.HTTPError as exc:  # lost mid-answer: the engine may still have run it
            outcome = state.outcome("info", error=f"{type(exc).__name__}: {exc}")
        except (ValueError, KeyError, TypeError, IndexError) as exc:  # malformed answer
            outcome = state.outcome("info", error=f"bad response: {type(exc).__name__}: {exc}")
        outcome.prompt_len = len(req.prompt_token_ids)
        self._record(outcome.type, req, process, phase, outcome.model_dump())
        return outcome

    async def _guarded_send(self, req: CompletionRequest, state: _Progress) -> CompletionOutcome:
        """``_send`` with the error mapping of :meth:`complete` (for the stage-aimed path)."""
        try:
            return await self._send(req, state, None)
        except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
            return state.outcome("fail", error=f"connect: {exc!r}")
        except httpx.HTTPError as exc:
            return state.outcome("info", error=f"{type(exc).__name__}: {exc}")
        except (ValueError, KeyError, TypeError, IndexError) as exc:
            return state.outcome("info", error=f"bad response: {type(exc).__name__}: {exc}")

    async def _complete_at_state(self, req: CompletionRequest, state: _Progress, stage: str,
                                 deadline_s: float | None) -> CompletionOutcome:
        """Send ``req`` and abort it once the engine reports it entered ``stage``.

        The watch (``GET /debug/requests/{id}?wait_for=stage``) is registered before the request
        is sent (its first line says so), so a stage of a few milliseconds is not missed. After
        the abort the engine is asked where it landed.
        """
        url = f"{self.base_url}/debug/requests/{req.request_id}"
        info: dict[str, Any] = {"at_state": stage, "reached": False}
        limit = deadline_s if deadline_s is not None else 3600.0
        watch = self._client.stream("GET", url, params={"wait_for": stage, "timeout_s": limit},
                                    timeout=httpx.Timeout(None, connect=STATE_WATCH_START_S))
        resp = None
        lines = None
        try:
            resp = await asyncio.wait_for(watch.__aenter__(), STATE_WATCH_START_S)
            if resp.status_code != 200:
                raise ValueError(f"HTTP {resp.status_code}")
            lines = resp.aiter_lines()
            first = json.loads(await asyncio.wait_for(lines.__anext__(), STATE_WATCH_START_S))
            if first.get("watching") != stage:
                raise ValueError(f"unexpected answer {first!r}")
        except (httpx.HTTPError, ValueError, KeyError, StopAsyncIteration, asyncio.TimeoutError) as exc:
            info["reason"] = (f"the engine offers no stage watch at {self.base_url}/debug/requests/{{id}} "
                              f"({type(exc).__name__}: {exc}); the request was not aborted")
            if resp is not None:
                await watch.__aexit__(None, None, None)
            out = await self._bounded(self._guarded_send(req, state), state, deadline_s)
            out.cancel = info
            return out
        send = asyncio.create_task(self._guarded_send(req, state))
        seen = asyncio.create_task(lines.__anext__())
        try:
            done, _ = await asyncio.wait({send, seen}, timeout=limit, return_when=asyncio.FIRST_COMPLETED)
            if seen in done and not seen.exception():
                result = json.loads(seen.result())
                info["entered"] = result.get("entered")
                if result.get("reached"):
                    info["reached"] = True
                    send.cancel()
                    await asyncio.gather(send, return_exceptions=True)
                    out = state.outcome("info", aborted=True, error=f"aborted by client in stage {stage}")
                    info.update(await self._abort_landing(url))
                    out.cancel = info
                    return out
            if send not in done:
                done, _ = await asyncio.wait({send}, timeout=max(0.0, limit - (time.monotonic() - state.t0)))
            if send not in done:
                send.cancel()
                await asyncio.gather(send, return_exceptions=True)
                out = state.outcome("info", error="deadline exceeded")
            else:
                out = send.result()
            info.setdefault("reason", f"the request never entered stage {stage} "
                            f"(last stage seen: {info.get('entered') or 'none'})")
            out.cancel = info
            return out
        finally:
            for t in (send, seen):
                if not t.done():
                    t.cancel()
            await asyncio.gather(send, seen, return_exceptions=True)
            await watch.__aexit__(None, None, None)

    async def _bounded(self, coro: Any, state: _Progress, deadline_s: float | None) -> CompletionOutcome:
        if deadline_s is None:
            return await coro
        try:
            return await asyncio.wait_for(coro, deadline_s)
        except asyncio.TimeoutError:
            return state.outcome("info", error="deadline exceeded")

    async def _timed_landing(self, req: CompletionRequest) -> dict[str, Any]:
        """Where a timed abort (first token, ``after_ms``) of ``req`` landed, in the shape of an
        ``at_state`` cancel's record: ``{"timed": True, "reached": True, "landed_in",
        "handled_in"[, "reason"]}``."""
        url = f"{self.base_url}/debug/requests/{req.request_id}"
        return {"timed": True, "reached": True, **await self._abort_landing(url)}

    async def _abort_landing(self, url: str) -> dict[str, Any]:
        """Where the engine says our abort landed: ``{"landed_in", "handled_in"}`` (None when it
        never recorded one within ABORT_LANDING_S: the request ended first, or at once when the
        engine has no request view: HTTP 404)."""
        end = time.monotonic() + ABORT_LANDING_S
        while True:
            try:
                r = await self._client.get(url, timeout=2.0)
                if r.status_code in (404, 405, 501):
                    return {"landed_in": None, "handled_in": None,
                            "reason": f"the engine has no view of this request ({url}: HTTP {r.status_code}: "
                                      "no such route, or the request never reached it)"}
                view = r.json() if r.status_code == 200 else {}
            except (httpx.HTTPError, ValueError):
                view = {}
            abort = view.get("abort") or {}
            if abort.get("arrived_in") is not None or view.get("stage") == "finished" or time.monotonic() >= end:
                landed = {"landed_in": abort.get("arrived_in"), "handled_in": abort.get("handled_in")}
                if landed["landed_in"] is None:
                    landed["reason"] = (f"the engine recorded no abort (stage {view.get('stage')!r}): "
                                        "the request ended before the abort reached it")
                return landed
            await asyncio.sleep(0.05)

    async def _send(self, req: CompletionRequest, state: _Progress, cancel: Cancel | None) -> CompletionOutcome:
        url = f"{self.base_url}/v1/completions"
        headers = {"X-Request-Id": req.request_id}
        async with self._client.stream("POST", url, json=self.body(req), headers=headers) as resp:
            state.status = resp.status_code
            if resp.status_code >= 400:
                raw = await resp.aread()
                return state.outcome("fail", error=_error_message(raw, resp.status_code))
            if not req.stream:
                data = json.loads(await resp.aread())
                state.absorb_final(data)
                return state.outcome("ok")
            async for line in resp.aiter_lines():
                if not line.startswith("data:"):
                    continue
                payload = line[5:].strip()
                if payload == "[DONE]":
                    state.done = True
                    break
                event = json.loads(payload)
                if "error" in event or event.get("object") == "error":
                    return state.outcome("fail", error=_error_message(payload.encode(), resp.status_code))
                state.absorb_event(event)
                if cancel is not None and cancel.after_first_token and state.token_ids:
                    raise _Abort()
            if not state.done:
                return state.outcome("info", error="stream ended without [DONE]")
            return state.outcome("ok")


class _Progress:
    """What has arrived so far for one request (kept when the request is cut short)."""

    def __init__(self, t0: float) -> None:
        self.t0 = t0
        self.token_ids: list[int] = []
        self.text = ""
        self.token_times: list[float] = []
        self.finish_reason: str | None = None
        self.cached_token_stats: dict[str, Any] | None = None
        self.usage: dict[str, Any] | None = None
        self.status: int | None = None
        self.done = False
        self.top_logprobs: list[list[list[float]]] | None = None

    def absorb_final(self, data: dict[str, Any]) -> None:
        choice = data["choices"][0]
        self.token_ids = list(choice.get("token_ids") or [])
        self.text = choice.get("text") or ""
        self.finish_reason = choice.get("finish_reason")
        self.usage = data.get("usage")
        self.cached_token_stats = ((data.get("kv_transfer_params") or {}).get("cached_token_stats"))
        logprobs = choice.get("logprobs")
        if isinstance(logprobs, dict):
            self.top_logprobs = parse_top_logprobs(logprobs.get("top_logprobs"))

    def absorb_event(self, event: dict[str, Any]) -> None:
        now = time.monotonic()
        for choice in event.get("choices") or []:
            ids = choice.get("token_ids") or []
            if ids:
                self.token_ids.extend(ids)
                self.token_times.extend([now] * len(ids))
            self.text += choice.get("text") or ""
            logprobs = choice.get("logprobs")
            if isinstance(logprobs, dict) and ids:
                self.top_logprobs = (self.top_logprobs or []) + parse_top_logprobs(logprobs.get("top_logprobs"))
            if choice.get("finish_reason"):
                self.finish_reason = choice["finish_reason"]
        if event.get("usage"):
            self.usage = event["usage"]
        stats = (event.get("kv_transfer_params") or {}).get("cached_token_stats")
        if stats is not None:
            self.cached_token_stats = stats

    def outcome(self, type_: str, *, error: str | None = None, aborted: bool = False) -> CompletionOutcome:
        times = self.token_times
        return CompletionOutcome(
            type=type_,
            token_ids=self.token_ids,
            text=self.text,
            finish_reason=self.finish_reason,
            ttft_s=(times[0] - self.t0) if times else None,
            itl_s=[b - a for a, b in zip(times, times[1:])],
            latency_s=time.monotonic() - self.t0,
            cached_token_stats=self.cached_token_stats,
            usage=self.usage,
            status=self.status,
            error=error,
            aborted=aborted,
            top_logprobs=self.top_logprobs,
        )


def _error_message(raw: bytes, status: int) -> str:
    try:
        data = json.loads(raw)
        msg = data.get("message") or (data.get("error") or {}).get("message") or raw.decode()[:300]
    except (ValueError, AttributeError):
        msg = raw.decode("utf-8", "replace")[:300]
    return f"HTTP {status}: {msg}"
