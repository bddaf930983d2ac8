"""Detached stacks: the stacks ``kvchaos stack up`` leaves running for later commands.

A detached stack started from a stack file keeps its state (``state.json``, logs, the run dir of
its services) in one folder per stack file under kvchaos's state dir (chaos/journal.py
``state_dir``); ``kvchaos stack status|down`` and ``kvchaos diagnose --attach`` find it there and
attach to it.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from chaos.journal import state_dir
from chaos.stack.base import Stack

__all__ = ["attach_detached", "detached_state_dir"]


def detached_state_dir(file: Path) -> Path:
    """Where a detached stack started from ``file`` keeps its state (one folder per stack file:
    ``<state dir>/stacks/<file stem>-<first 10 hex digits of the SHA-1 of its resolved path>``)."""
    key = hashlib.sha1(str(file.resolve()).encode()).hexdigest()[:10]
    return state_dir() / "stacks" / f"{file.stem}-{key}"


def attach_detached(run_dir: Path) -> Stack:
    """The stack a `kvchaos stack up` left in ``run_dir``: a ComposeStack when its state.json
    says ``"backend": "compose"``, else a LocalStack.

    Raises:
        ConfigError: the stack file changed and no longer loads.
        StackError: a compose stack, and no Docker engine answers.
    """
    state = json.loads((run_dir / "state.json").read_text())
    if state.get("backend") == "compose":
        from chaos.stack.compose import ComposeStack

        return ComposeStack.attach(run_dir)
    from chaos.stack.local import LocalStack

    return LocalStack.attach(run_dir)
