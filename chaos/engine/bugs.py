"""Planted bug classes (``--bug NAME``, repeatable). Without ``--bug`` none of them exists.

Each one reproduces a class from /work/shared/corpus/field-reports.md, so that the scenario
catalogue can prove it catches it. One line each: the name is the CLI value, the report name
and the value in ``/debug/state``'s ``bugs``.
"""

from __future__ import annotations

BUGS: dict[str, str] = {
    # F3/F7: an LMCache retrieve that failed (or was cut short) still counts as loaded KV.
    "trust-failed-load":
        "a failed or partial LMCache load is trusted as a hit (blocks keep stale KV)",
    # F9/F8: abort leaks the server-side lookup locks and session.
    "skip-abort-cleanup":
        "on abort, skip free_lookup_locks and end_session (locks and session leak)",
    # F1/F2: off-by-one hit length.
    "hit-plus-one-token": "report (and skip computing) one token more than LMCache loaded",
    "hit-plus-one-chunk": "report (and skip computing) one chunk more than LMCache loaded",
    # F12: the cache key lacks tenant identity.
    "drop-cache-salt": "cache_salt is left out of the LMCache key and the local prefix-cache hash",
    # F10: bookkeeping drift under preemption.
    "stale-blocks-on-resume": "a preempted request resumes on its old block ids without recompute",
    # F4: a failed load is retried forever instead of recomputed (head-of-line livelock).
    "retry-failed-load-forever":
        "a failed LMCache load is retried every step (the failure mark is never cleared), "
        "never recomputed; admission waits behind it",
    # F5: a timed-out lookup is polled again; the adapter's KeyError kills the engine.
    "repoll-timed-out-lookup":
        "a timed-out lookup is polled again; the adapter raises KeyError and the engine dies",
    # F11: the client never reconnects after losing the LMCache server.
    "no-reconnect": "once LMCache is unhealthy, never use it again (no lookups, stores, hits)",
    # Engine-side leak: the request leaves the engine's table but its KV blocks stay allocated
    # (seen only in the pool's usage: vllm:kv_cache_usage_perc, not in /debug/state's
    # blocks_held_by_requests, which counts the table).
    "hold-blocks-on-abort":
        "on a client abort, the request is dropped but its KV blocks are never freed",
    # store ordering: the chunk's KV is not computed yet when it is stored.
    "store-before-compute":
        "full chunks are stored right after allocation, before their KV is computed",
    # F8 (LMCache issue 1034): the engine's prefix cache covers the whole LMCache hit; the
    # retrieve that would unlock never runs and the lookup's locks are not freed either.
    "keep-locks-on-local-hit":
        "when the local prefix cache covers the whole LMCache hit, the lookup's read locks "
        "are never freed",
    # A store that starts after an LMCache hit takes the wrong blocks: the chunks it writes
    # under the later chunks' keys hold the prompt's first chunks' KV.
    "store-after-hit-wrong-blocks":
        "a store that starts after an LMCache hit (or an earlier store) reads the prompt's "
        "first blocks instead of its own chunks' blocks",
    # F3/F8: a failed (or dropped) load frees the lookup's read locks one chunk short.
    "short-free-after-failed-load":
        "after a failed or dropped LMCache load, free the lookup's read locks one chunk short",
}


def validate_bugs(names: list[str]) -> list[str]:
    """Check ``--bug`` values.

    Args:
        names: values given on the command line.

    Returns:
        the sorted, de-duplicated names.

    Raises:
        ValueError: an unknown name (the message lists the known ones).
    """
    unknown = [n for n in names if n not in BUGS]
    if unknown:
        raise ValueError(f"unknown --bug {unknown}; known: {', '.join(sorted(BUGS))}")
    return sorted(set(names))
