"""Environment every process that imports lmcache must have (no telemetry, no banner).

Set with ``setdefault`` before the first ``import lmcache``: LMCache's usage tracking is on by
default and calls a public host (see /work/shared/notes/lmcache-on-cpu.md).
"""

from __future__ import annotations

import os

LMCACHE_ENVIRONMENT: dict[str, str] = {
    "LMCACHE_TRACK_USAGE": "false",
    "DO_NOT_TRACK": "1",
    "LMCACHE_DISABLE_BANNER": "1",
    "VLLM_NO_USAGE_STATS": "1",
}


def apply_lmcache_environment(env: dict[str, str] | None = None) -> dict[str, str]:
    """Set the no-telemetry variables in ``env`` unless already set.

    Args:
        env: the mapping to update; ``os.environ`` when None.

    Returns:
        The updated mapping (for building a child process's environment).
    """
    target = os.environ if env is None else env
    for key, value in LMCACHE_ENVIRONMENT.items():
        target.setdefault(key, value)
    return target  # type: ignore[return-value]
