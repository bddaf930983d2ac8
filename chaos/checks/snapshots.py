"""Snapshots: the final state the runner collects next to the history, input to every check.

The history says what clients and the nemesis saw; snapshots say what the stack looked like
around it. The runner fills them (all fields optional, so a check whose input is missing
answers "unknown" instead of guessing):

- `expected`: request id -> token ids the recompute twin (same model, cache off, local prefix
  cache off) produced for the same prompt and cache_salt. The recompute oracle.
- `leak_samples`: readings of each leak source polled after the workload, until every field
  is 0 or the quiesce deadline passes. `leak_errors`: polls that failed.
- `service_exits`: every service process that exited during the run, and whether a fault
  (process kill) caused it.
- `leak_baselines`: each leak source's reading before the first phase (for sources whose
  fields must return to that baseline rather than to 0).
- `expected_top_logprobs`, `recompute_replay`, `recompute_replay_top_logprobs`: for
  recompute_equivalence's tolerant mode, the twin's top-2 logprobs of every expected token,
  and the twin asked again (its noise floor).
- `twin_baseline`: the recompute twin timed on the prompts of requests that went past their
  deadline or SLO bound (a fault in place or not), at the workload's concurrency, right after the
  phases (only when some request did): the run's own baseline for chaos/checks/host_load.py.
"""

from __future__ import annotations

from pydantic import BaseModel, Field


class LeakSample(BaseModel):
    """One reading of one leak source.

    Attributes:
        source: leak source name (x-kvchaos `leak_sources[].name`, e.g. "lmcache", "engine").
        time: s since run start (same clock as the history).
        values: reported field name -> number (locks, pins, sessions, staging bytes, ...);
            None when the field's path was missing from the answer.
    """

    source: str
    time: float
    values: dict[str, float | None]


class LeakError(BaseModel):
    """A poll of a leak source that failed (connection refused, bad JSON, HTTP 5xx)."""

    source: str
    time: float
    error: str


class ServiceExit(BaseModel):
    """A service process that exited while the run was going on.

    Attributes:
        service: service name in the stack file.
        time: s since run start.
        returncode: the process exit status (negative: killed by that signal number).
        killed_by_fault: True when a nemesis fault (process kill/restart) caused the exit.
    """

    service: str
    time: float
    returncode: int | None = None
    killed_by_fault: bool = False


class TwinTiming(BaseModel):
    """The recompute twin's time for one request's prompt (s).

    Attributes:
        outcome: ``ok`` (answered), ``info`` (no answer within ``waited_s``), ``fail`` (error).
        latency_s / ttft_s: sending to the last byte / to the first streamed token (ttft only
            for a streamed request); None when not measured.
        waited_s: how long the runner was prepared to wait for it.
        error: why it gave no figure.
    """

    outcome: str
    latency_s: float | None = None
    ttft_s: float | None = None
    waited_s: float = 0.0
    error: str | None = None


class TwinBaseline(BaseModel):
    """The recompute twin timed in the same run (chaos/runner/baseline.py).

    Attributes:
        concurrency: requests in flight at once (the workload's).
        timings: original request id -> the twin's time for its prompt; the slow requests and
            the peers of their phases sent beside them to fill the concurrency.
        slow: ids of the slow requests the measurement was for.
        load_average: the host's 1-minute load average when the measurement began.
        took_s: how long the measurement took.
        error: why there is no measurement (no twin in the stack, it was unreachable).
    """

    concurrency: int = 1
    timings: dict[str, TwinTiming] = Field(default_factory=dict)
    slow: list[str] = Field(default_factory=list)
    load_average: float | None = None
    took_s: float | None = None
    error: str | None = None


class Snapshots(BaseModel):
    """Everything the checks need besides the history.

    Attributes:
        expected: request_id -> expected output token ids from the recompute twin.
        expected_top_logprobs: request_id -> per expected token, the twin's top-2
            alternatives ``[[id, logprob], [id, logprob]]`` (tolerant mode only).
        recompute_replay: request_id -> token ids of the twin asked the same prompt again, one
            request at a time (one id per distinct prompt; tolerant mode only): the noise floor.
        recompute_replay_top_logprobs: the replay's top-2 logprobs, same keys.
        recompute_replay_error: why the replay could not be made (None: made or not asked).
        leak_baselines: source name -> field -> reading before the first phase (None: that
            field could not be read), for ``baseline: before_faults`` sources.
        leak_sources: names of the leak sources the runner polled (so a source that never
            answered is visible even with no sample and no error).
        leak_samples: chronological readings, all sources mixed.
        leak_errors: failed polls.
        quiesce_waited_s: seconds the runner waited for leak counters to reach 0 (None: unknown).
        service_exits: exits of service processes during the run.
        chunk_size: LMCache chunk size in tokens (256 by default), for report wording.
        twin_baseline: the twin's times for slow requests' prompts (None: not measured).
    """

    expected: dict[str, list[int]] = Field(default_factory=dict)
    expected_top_logprobs: dict[str, list[list[list[float]]]] = Field(default_factory=dict)
    recompute_replay: dict[str, list[int]] = Field(default_factory=dict)
    recompute_replay_top_logprobs: dict[str, list[list[list[float]]]] = Field(default_factory=dict)
    recompute_replay_error: str | None = None
    leak_baselines: dict[str, dict[str, float | None]] = Field(default_factory=dict)
    leak_sources: list[str] = Field(default_factory=list)
    leak_samples: list[LeakSample] = Field(default_factory=list)
    leak_errors: list[LeakError] = Field(default_factory=list)
    quiesce_waited_s: float | None = None
    service_exits: list[ServiceExit] = Field(default_factory=list)
    chunk_size: int = 256
    twin_baseline: TwinBaseline | None = None
