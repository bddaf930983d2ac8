"""The run history: one JSON line per operation, Jepsen-style (docs/architecture.md section 3).

    client-0 ─┐  invoke ... ok | fail | info      (f="complete", request_id)
    client-N ─┼─> HistoryWriter ──> history.jsonl (appended and flushed per op)
    nemesis  ─┘  invoke ... ok | fail             (f="apply" | "heal", fault_id)

Every op is flushed as it is written, so a run that is killed keeps its history up to the last
op. ``time`` is monotonic seconds since the writer was created (the run start).
"""

from __future__ import annotations

import json
import threading
import time as _time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

__all__ = ["Op", "OpType", "HistoryWriter", "load_history", "HistoryError"]

OpType = Literal["invoke", "ok", "fail", "info"]


class Op(BaseModel):
    """One history record.

    ``type``: invoke (started), ok (completed), fail (definitely did not happen / ended in an
    error), info (indeterminate: aborted on purpose, timed out with no answer).
    ``f``: "complete" (a request), "apply" / "heal" (a fault); other layers may add their own.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    index: int = Field(ge=0, description="position in the history, from 0")
    time: float = Field(description="seconds since run start (monotonic clock)")
    process: str = Field(description='"client-N" or "nemesis"')
    type: OpType
    f: str = Field(description='"complete", "apply" or "heal"')
    phase: str = ""
    request_id: str | None = None
    fault_id: str | None = None
    value: dict[str, Any] = Field(default_factory=dict)


class HistoryError(ValueError):
    """A history file line is not a valid Op (the message names file:line)."""


class HistoryWriter:
    """Appends ops to a JSON-lines file as they happen, and keeps them in memory.

    Thread-safe (one lock); each write is a short synchronous append + flush, so it is fine to
    call from asyncio code. ``path=None`` keeps the history in memory only.
    """

    def __init__(
        self, path: str | Path | None = None, *, clock: Callable[[], float] = _time.monotonic
    ) -> None:
        self.path = Path(path) if path is not None else None
        self._clock = clock
        self._t0 = clock()
        self._lock = threading.Lock()
        self._ops: list[Op] = []
        self._file: IO[str] | None = None
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - closed in close()

    def now(self) -> float:
        """Seconds since run start (the ``time`` an op written now gets)."""
        return self._clock() - self._t0

    def append(
        self,
        process: str,
        type: OpType,
        f: str,
        *,
        phase: str = "",
        request_id: str | None = None,
        fault_id: str | None = None,
        value: dict[str, Any] | None = None,
    ) -> Op:
        """Record one op now and return it.

        Raises:
            ValueError: ``value`` is not JSON-serialisable, or the writer is closed.
        """
        with self._lock:
            op = Op(
                index=len(self._ops),
                time=self.now(),
                process=process,
                type=type,
                f=f,
                phase=phase,
                request_id=request_id,
                fault_id=fault_id,
                value=value or {},
            )
            line = op.model_dump_json()  # raises on a non-JSON value before anything is written
            if self.path is not None:
                if self._file is None:
                    raise ValueError(f"history {self.path} is closed")
                self._file.write(line + "\n")
                self._file.flush()
            self._ops.append(op)
            return op

    @property
    def ops(self) -> list[Op]:
        """A copy of the ops written so far, in order."""
        with self._lock:
            return list(self._ops)

    def close(self) -> None:
        """Flush and close the file (idempotent). The in-memory ops stay readable."""
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None

    def __enter__(self) -> HistoryWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def load_history(path: str | Path) -> list[Op]:
    """Read a history.jsonl file.

    A truncated last line (the run was killed mid-write) is dropped; blank lines are skipped.

    Raises:
        FileNotFoundError: no such file.
        HistoryError: a line other than the last is not a valid Op (message: file:line: why).
    """
    path = Path(path)
    lines = path.read_text(encoding="utf-8").split("\n")
    ops: list[Op] = []
    for n, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            ops.append(Op.model_validate(json.loads(line)))
        except (json.JSONDecodeError, ValidationError) as exc:
            is_last = all(not rest.strip() for rest in lines[n:])
            if is_last and not line.endswith("}"):
                break  # cut off mid-write
            raise HistoryError(f"{path}:{n}: not a history op: {str(exc).splitlines()[0]}") from None
    return ops
