"""Planted bugs of the vLLM CPU stack: small wrappers around LMCache's vLLM connector.

``kvchaos run --stack compose/vllm-cpu.yml --bug NAME`` sets the stack variable
``KVCHAOS_ENGINE_BUGS``; the stack file hands it to the engine (never to the recompute twin) as
``KVCHAOS_VLLM_BUGS``, and :mod:`chaos.vllm.launch` calls :func:`install` in every vLLM process
(the API server, and the engine core and worker vLLM spawns). :func:`install` does not import
LMCache: it registers an import hook, and each wrapper is put in place when vLLM itself imports
the LMCache module it patches, in whichever process does so (the connector's scheduler side runs
in the engine core, its worker side in the worker). Each process that patches says so on stderr
(``kvchaos planted bug NAME: patched CLASS.METHOD in pid N``), and the first time a wrapper
changes what the connector does it says ``... fired ...``: both lines land in the engine's log.

The patched code is LMCache 0.5.6's ``lmcache.integration.vllm.lmcache_mp_connector``
(``LMCacheMPConnector``, which vLLM 0.32 picks over its bundled copy when lmcache imports) and
``lmcache.integration.vllm.lmcache_mp_metadata`` (``LMCacheMPRequestTracker``). None of LMCache's
code is copied here: every wrapper calls the original and changes its input or its result.

Which catalogue scenario is meant to catch each bug on this stack: :data:`ZOO_MAP`.
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.machinery
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

__all__ = ["BUGS", "CONNECTOR", "DIAGNOSIS", "METADATA", "ZOO_MAP", "Bug", "install", "patch_module", "patched"]

CONNECTOR = "lmcache.integration.vllm.lmcache_mp_connector"
METADATA = "lmcache.integration.vllm.lmcache_mp_metadata"

_fired: set[str] = set()


def _say(message: str) -> None:
    print(f"kvchaos planted bug {message} in pid {os.getpid()}", file=sys.stderr, flush=True)


def _fire(name: str, detail: str) -> None:
    """Log the first time in this process that bug ``name`` changed what the connector did."""
    if name not in _fired:
        _fired.add(name)
        _say(f"{name}: fired ({detail})")


def _wrap(cls: type, method: str, name: str, make: Callable[[Callable[..., Any]], Callable[..., Any]]) -> None:
    """Replace ``cls.method`` by ``make(original)`` once (a second install is a no-op)."""
    original = layer = cls.__dict__[method]
    while getattr(layer, "_kvchaos_bug", None):  # wrappers of other bugs may sit on top
        if layer._kvchaos_bug == name:
            return
        layer = layer.__wrapped__
    wrapper = functools.wraps(original)(make(original))
    wrapper._kvchaos_bug = name  # type: ignore[attr-defined]
    setattr(cls, method, wrapper)
    _say(f"{name}: patched {cls.__name__}.{method}")


def _hit_plus(name: str, extra: Callable[[Any], int]) -> Callable[[ModuleType], None]:
    """get_num_new_matched_tokens reports ``extra(connector)`` tokens more than LMCache will
    load (kept below the prompt's last token, which vLLM always computes). The retrieve still
    covers only the tokens LMCache found (its range comes from the request tracker), so the
    extra tokens' blocks are never written and the request attends over whatever they held."""

    def patch(mod: ModuleType) -> None:
        def make(orig: Callable[..., Any]) -> Callable[..., Any]:
            def get_num_new_matched_tokens(self: Any, request: Any, num_computed_tokens: int) -> Any:
                need, load_async = orig(self, request, num_computed_tokens)
                if need:
                    room = len(request.all_token_ids) - 1 - num_computed_tokens - need
                    more = min(extra(self), room)
                    if more > 0:
                        _fire(name, f"request {request.request_id}: {need} + {more} tokens reported")
                        need += more
                return need, load_async
            return get_num_new_matched_tokens

        _wrap(mod.LMCacheMPConnector, "get_num_new_matched_tokens", name, make)

    return patch


def _drop_cache_salt(mod: ModuleType) -> None:
    """The request tracker forgets the request's cache_salt: lookups, stores and retrieves of
    every tenant use one key space (the tracker is what every LMCache key is built from)."""

    def make(orig: Callable[..., Any]) -> Callable[..., Any]:
        def __init__(self: Any, request: Any, *args: Any, **kwargs: Any) -> None:
            orig(self, request, *args, **kwargs)
            if self.cache_salt:
                _fire("drop-cache-salt", f"request {request.request_id}: salt {self.cache_salt!r} dropped")
                self.cache_salt = ""
        return __init__

    _wrap(mod.LMCacheMPRequestTracker, "__init__", "drop-cache-salt", make)


def _skip_end_session(mod: ModuleType) -> None:
    """request_finished never ends the request's LMCache session (every request leaks one)."""

    def make(orig: Callable[..., Any]) -> Callable[..., Any]:
        def request_finished(self: Any, request: Any, block_ids: Any) -> Any:
            adapter = self.scheduler_adapter
            adapter.end_session = lambda request_id: _fire("skip-end-session", f"request {request_id}")
            try:
                return orig(self, request, block_ids)
            finally:
                del adapter.end_session  # the class's method again
        return request_finished

    _wrap(mod.LMCacheMPConnector, "request_finished", "skip-end-session", make)


def _skip_abort_cleanup(mod: ModuleType) -> None:
    """An aborted request (a client that went away) finishes without ending its LMCache session
    and without dropping its pending lookup; finished requests clean up as before."""
    from vllm.v1.request import RequestStatus

    def make(orig: Callable[..., Any]) -> Callable[..., Any]:
        def request_finished(self: Any, request: Any, block_ids: Any) -> Any:
            if request.status != RequestStatus.FINISHED_ABORTED:
                return orig(self, request, block_ids)
            adapter = self.scheduler_adapter
            adapter.end_session = lambda request_id: _fire("skip-abort-cleanup", f"request {request_id}")
            adapter.cleanup_lookup_result = lambda request_id: None
            try:
                return orig(self, request, block_ids)
            finally:
                del adapter.end_session, adapter.cleanup_lookup_result
        return request_finished

    _wrap(mod.LMCacheMPConnector, "request_finished", "skip-abort-cleanup", make)


def _store_wrong_blocks(mod: ModuleType) -> None:
    """The worker writes every chunk of a store from the engine blocks of the store's first
    chunk: the later chunks' keys hold the first chunk's KV, which a later hit loads as theirs.
    (Not a reordering: attention over a prefix is blind to the order of its cached keys, whose
    positions are already rotated in, so swapped blocks would load the same answer.)"""

    def make(orig: Callable[..., Any]) -> Callable[..., Any]:
        def wait_for_save(self: Any) -> None:
            per_chunk = self.worker_adapter.blocks_in_chunk
            for meta in self._get_connector_metadata().requests:
                groups = meta.op.block_ids if meta.direction == "STORE" else None
                if not groups:
                    continue
                flat = isinstance(groups[0], int)
                wrong = [[g[i % per_chunk] for i in range(len(g))] for g in ([groups] if flat else groups)]
                if wrong != ([groups] if flat else groups):
                    _fire("store-wrong-blocks", f"request {meta.request_id}: chunks stored from the first chunk's blocks")
                    meta.op.block_ids = wrong[0] if flat else wrong
            orig(self)
        return wait_for_save

    _wrap(mod.LMCacheMPConnector, "wait_for_save", "store-wrong-blocks", make)


@dataclass(frozen=True)
class Bug:
    """One planted bug: what it does, the module it patches and the patch."""

    summary: str
    module: str
    patch: Callable[[ModuleType], None]


#: Planted bugs of the vLLM stack (name -> bug). The names are the reference engine's where the
#: class is the same (chaos/engine/bugs.py), so a zoo row means the same thing on both stacks.
BUGS: dict[str, Bug] = {
    "hit-plus-one-chunk": Bug(
        "report one LMCache chunk more than LMCache will load as an external hit",
        CONNECTOR, _hit_plus("hit-plus-one-chunk", lambda c: c.scheduler_adapter.lmcache_tokens_per_chunk)),
    "hit-plus-one-token": Bug(
        "report one token more than LMCache will load as an external hit",
        CONNECTOR, _hit_plus("hit-plus-one-token", lambda _c: 1)),
    "drop-cache-salt": Bug(
        "cache_salt is left out of every LMCache key (lookup, store, retrieve)",
        METADATA, _drop_cache_salt),
    "skip-end-session": Bug(
        "a finished request never ends its LMCache session (sessions leak)",
        CONNECTOR, _skip_end_session),
    "skip-abort-cleanup": Bug(
        "an aborted request ends neither its LMCache session nor its pending lookup",
        CONNECTOR, _skip_abort_cleanup),
    "store-wrong-blocks": Bug(
        "the worker writes every chunk of a store from the blocks of its first chunk",
        CONNECTOR, _store_wrong_blocks),
}


#: Planted bug -> the catalogue scenarios meant to catch it on the vLLM stack (`kvchaos zoo
#: --stack compose/vllm-cpu.yml`); each one runs there (`kvchaos list --stack`).
ZOO_MAP: dict[str, list[str]] = {
    "hit-plus-one-chunk": ["smoke"],
    "hit-plus-one-token": ["chunk-boundary-full-hit"],
    "drop-cache-salt": ["tenant-isolation"],
    "skip-end-session": ["smoke"],
    "skip-abort-cleanup": ["cancel-storm"],
    "store-wrong-blocks": ["smoke"],
}


#: Planted bug -> the class `kvchaos diagnose` must name for the requests its scenario fails
#: (chaos/diagnose/verdict.py), or None where the bug fails only the leaks check: a leak is the
#: stack's state after quiesce, not a request's answer, and diagnose answers "nothing to
#: diagnose", naming the failed leaks check.
DIAGNOSIS: dict[str, str | None] = {
    "hit-plus-one-chunk": "prefix_length",
    "hit-plus-one-token": "prefix_length",
    "drop-cache-salt": "key_identity",
    "skip-end-session": None,
    "skip-abort-cleanup": None,
    "store-wrong-blocks": "kv_content",
}


def patch_module(module: ModuleType, names: list[str]) -> None:
    """Apply each bug of ``names`` whose target is ``module`` (already imported)."""
    for n in names:
        if BUGS[n].module == module.__name__:
            BUGS[n].patch(module)


class _PatchAfterImport(importlib.abc.MetaPathFinder):
    """Finds the patched modules with the other finders and patches each once it is executed."""

    def __init__(self, names: list[str]) -> None:
        self.names = names
        self.targets = {BUGS[n].module for n in names}

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if fullname not in self.targets:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None and spec.loader is not None:
                loader = spec.loader
                exec_module = loader.exec_module
                names = self.names

                class _Loader(importlib.abc.Loader):
                    def create_module(self, spec: Any) -> Any:
                        return loader.create_module(spec)

                    def exec_module(self, module: ModuleType) -> None:
                        exec_module(module)
                        patch_module(module, names)

                spec.loader = _Loader()
                return spec
        return None


def install(names: list[str]) -> None:
    """Plant the bugs ``names`` in this process: patched now where LMCache's module is already
    imported, otherwise when it is.

    Raises:
        ValueError: an unknown name (the message lists the known ones).
    """
    unknown = [n for n in names if n not in BUGS]
    if unknown:
        raise ValueError(f"unknown bug {', '.join(unknown)} (the vLLM stack's set); known: {', '.join(sorted(BUGS))}")
    if not names:
        return
    for target in {BUGS[n].module for n in names}:
        if target in sys.modules:
            patch_module(sys.modules[target], names)
    sys.meta_path.insert(0, _PatchAfterImport(names))


def patched() -> list[str]:
    """The bugs whose wrappers sit on LMCache's connector classes in this process (imports
    LMCache's vLLM connector, so only in the vLLM venv), sorted.

    Raises:
        ImportError: LMCache's connector does not import here (no vLLM).
    """
    connector = importlib.import_module(CONNECTOR)
    metadata = importlib.import_module(METADATA)
    seen: set[str] = set()
    for cls in (connector.LMCacheMPConnector, metadata.LMCacheMPRequestTracker):
        for attr in vars(cls).values():
            while getattr(attr, "_kvchaos_bug", None):
                seen.add(attr._kvchaos_bug)
                attr = attr.__wrapped__
    return sorted(seen)
