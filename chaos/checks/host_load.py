"""host_load: a request slower than its bound, judged against the run's own baseline.

A deadline or an SLO bound is a number picked on an idle machine. On a shared CI runner (load
average 12-20 on two cores) every request of a phase can take two to three times its usual time
with no fault in place, and a request just past its deadline says nothing about the stack. So
`liveness` and `slo` ask this module, for each request whose time went past its bound, whether
the run's own baseline was as slow, measured IN THE SAME RUN:

    slow request r (value v > bound b) ──┬─ never completed ...................... failed
                                         ├─ twin answered r's prompt in t:  v <= K_TWIN * t   host load
                                         │                                  v >  K_TWIN * t   failed
                                         │                                  (a fault in place: "fault")
                                         ├─ twin gave no answer within v ........ host load
                                         ├─ a fault in place during its life, no twin figure
                                         │  ........................................ fault (judged as before)
                                         └─ no twin figure: fault-free peers of r's phase (>= MIN_PEERS,
                                            completed ok): median >= b / K_PEERS  host load, else failed

- **The twin** (``snapshots.twin_baseline``): the stack's recompute twin (same model, no cache)
  asked r's very prompt, with r's max_tokens and stream flag, at the workload's concurrency (r's
  prompt among prompts of its phase, so the twin batches as many requests as the engine did),
  right after the quiesce, seconds after the phases (chaos/runner/baseline.py). Its timings are taken by the runner, not
  the recompute oracle, whose answers come from a store across runs. The twin recomputes every
  token a cache path may load, so a healthy stack is not slower than it by more than the cost of
  a lookup and a store: on a steady host the ratio request / twin is about 1 (cold misses) or
  below (hits).
- **K_TWIN = 3**: a request up to three times the twin's time is host load. The factor covers
  what the twin cannot reproduce: the load moving between the phase and the measurement (other
  jobs start and stop), LMCache's process and the proxy competing for the same cores during the
  phase (a request of the engine crosses three processes, the twin's one: on an oversubscribed
  host every crossing waits for a time slice), and the stores of a cold miss. Measured: 2 was
  too little at load average 20-27 on two cores (three catalogue runs beside 8 busy loops,
  2026-12-07): the first warm requests of a fresh stack, with no fault in place, were given up on
  at their 30 s deadline while the twin took 13.4-14.8 s for the same prompts (x2.0-2.2, a
  lower bound: the request was cut at the deadline), and their KV was being stored, so they were
  progressing, not stuck. A stuck request runs to the deadline whatever the host does, so with
  K_TWIN = 3 it is caught whenever the deadline is more than three times the twin's time: every
  catalogue deadline is 5-20 times the idle latency, so only a host that is already past a
  third of the deadline turns a stuck request into "unknown", never into "passed".
- **A prompt the runner did not time** (it times at most MAX_WAVES x concurrency slow requests,
  the slowest first) takes the twin's figure of the other prompts of its phase that it timed:
  the fastest answer, or with none answered the shortest wait (:func:`twin_for`), the figure
  that is hardest to excuse with.
- **A twin that gave no answer** within the runner's bound (at least the slowest late request's
  time) was at least as slow as the request: host load.
- **Peers**, used only without a twin figure (no twin in the stack, or it answered with an
  error): the requests of r's phase that completed ok with no fault in place during their life,
  r excluded. **MIN_PEERS = 3** so one outlier does not decide; the **median** (not the mean,
  not the max) so one other slow request does not either; **K_PEERS = 2**: a phase whose
  typical request took at least half the bound ran slow as a whole, and prompts of one phase
  differ in length by up to about 2x, so r at the bound is within the phase's spread. A phase
  whose peers answered fast while r ran to its deadline has a stuck request: failed. Peers that
  were late themselves are not peers (a wedged stack would otherwise excuse itself).
- **A fault in place** during r's life (from the apply's invoke to the heal's completion; a fault
  never healed lasts to the end of the run) may be the cause of r's lateness, so only the twin
  can excuse it: no fault touches the twin (no connector, no proxied link, never a fault's
  target), and it computes every token, which is what a request whose cache path the fault
  broke has to do too. With the twin as slow (within K_TWIN, or no answer within v), the host
  was too slow for the bound to say anything: host load. With the twin fast, or no twin figure,
  r is the fault's effect: judged as before ("fault"). Peers are never asked for such a
  request: the same fault may slow them all, and a stack it wedged would excuse itself.
  Input: l2-partial-read at load average 20-27 (2026-12-07), its first 4 requests under the
  cut Redis link given up on at 30 s while LMCache logged their recomputed chunks being stored
  13-30 s into the phase: the host, not the fault, had made them late.
  A request that never completed, or a process that exited unexplained, is never host load
  (liveness decides those before it asks this module).

Every judgement keeps its figures (value, bound, twin time and ratio, peers' count and median,
the fault ids) for the report.
"""

from __future__ import annotations

import statistics
from typing import Any, Iterable, Literal, Sequence

from pydantic import BaseModel, Field

from chaos.checks.requests import RequestRecord, op_dicts
from chaos.checks.snapshots import TwinBaseline, TwinTiming
from chaos.history import Op

#: A request up to K_TWIN times the twin's time for the same prompt is host load (module doc:
#: 2 was measured too little at load average 20-27 on two cores).
K_TWIN = 3.0
#: Fault-free peers whose median is at least bound / K_PEERS show a slow phase.
K_PEERS = 2.0
#: Fewest fault-free peers whose median counts.
MIN_PEERS = 3

Metric = Literal["latency", "ttft"]


class FaultWindow(BaseModel):
    """When a fault could act: from its apply's invoke to its heal's completion (s since run
    start; ``end`` None: never healed, in place to the end of the run)."""

    fault_id: str
    kind: str = ""
    start: float
    end: float | None = None


class Judgement(BaseModel):
    """What one slow request is: ``host_load`` (the baseline was as slow: inconclusive),
    ``failed`` (the baseline was fast, or there is none), or ``fault`` (a fault was in place:
    judged as before). Times in s."""

    request_id: str
    phase: str
    metric: Metric
    value_s: float | None
    bound_s: float
    verdict: Literal["host_load", "failed", "fault"]
    reason: str
    faults: list[str] = Field(default_factory=list)
    twin_s: float | None = None
    twin_timed_out: bool = False
    twin_ratio: float | None = None
    peers: int = 0
    peers_median_s: float | None = None


def fault_windows(history: Iterable[Op | dict[str, Any]]) -> list[FaultWindow]:
    """Every nemesis fault's window, from the earliest apply op to the heal's completion.

    The apply's invoke (not its ok) starts the window, so a fault taking effect while its apply
    runs is in place; a failed apply still counts (it may have acted in part).
    """
    out: dict[str, FaultWindow] = {}
    for op in op_dicts(history):
        if op.get("process") != "nemesis" or op.get("fault_id") is None:
            continue
        fid, t = str(op["fault_id"]), float(op.get("time") or 0.0)
        f = op.get("f")
        if f == "apply":
            w = out.setdefault(fid, FaultWindow(fault_id=fid, kind=str(op["value"].get("kind") or ""), start=t))
            w.start = min(w.start, t)
        elif f == "heal" and op.get("type") != "invoke" and fid in out:
            out[fid].end = t
    return list(out.values())


def faults_during(rec: RequestRecord, windows: Sequence[FaultWindow]) -> list[str]:
    """Ids of the faults in place at some moment of ``rec``'s life (invoke to completion; a
    request that never completed lives to the end of the run)."""
    end = rec.end_time if rec.end_time is not None else float("inf")
    return [w.fault_id for w in windows
            if w.start <= end and (w.end is None or rec.invoke_time <= w.end)]


def metric_of(rec: RequestRecord, metric: Metric) -> float | None:
    """The request's latency or TTFT (s), None when not measured."""
    return rec.latency_s if metric == "latency" else rec.ttft_s


def _fmt(x: float | None) -> str:
    if x is None:
        return "?"
    return f"{x:.1f}s" if x >= 10 else f"{x:.2f}s"


def twin_for(rec: RequestRecord, metric: Metric, everyone: Sequence[RequestRecord],
             twin: TwinBaseline | None) -> tuple[TwinTiming | None, str]:
    """The twin's figure for ``rec``: its own prompt's timing, else, when the runner timed other
    prompts of ``rec``'s phase but not this one (it times at most MAX_WAVES x concurrency, the
    slowest first), the most demanding figure of those for the rule: the fastest answer
    (``ok``), or with none answered the shortest wait without an answer (``info``).

    Returns:
        ``(timing or None, what it was measured on: "the same prompt" or "N other prompt(s) of
        phase P")``.

    Input of the phase figure: cancel-storm at load average 29 (2026-12-07): 10 warm requests
    given up on at 30 s; the twin, timed on the 8 slowest, gave no answer within 31 s for any of
    them, and the 2 left untimed were judged on peers (none, all late): failed.
    """
    if twin is None:
        return None, "the same prompt"
    own = twin.timings.get(rec.request_id)
    if own is not None:
        return own, "the same prompt"
    others = [twin.timings[p.request_id] for p in everyone
              if p.phase == rec.phase and p.request_id != rec.request_id and p.request_id in twin.timings]
    answered = [(t.latency_s if metric == "latency" else t.ttft_s) for t in others if t.outcome == "ok"]
    answered = [a for a in answered if a is not None and a > 0]
    where = f"{len(others)} other prompt(s) of phase {rec.phase} (its own was not timed)"
    if answered:
        return TwinTiming(outcome="ok", latency_s=min(answered), ttft_s=min(answered)), where
    waits = [t.waited_s for t in others if t.outcome == "info"]
    if waits:
        return TwinTiming(outcome="info", waited_s=min(waits), error="no answer"), where
    return None, "the same prompt"


def _by_twin(base: dict[str, Any], metric: Metric, value: float, bound_s: float, in_place: list[str],
             timing: TwinTiming | None, prompt: str) -> Judgement | None:
    """The judgement the twin's figure gives (module doc), None when there is no usable figure.
    With faults ``in_place`` a fast twin makes the request the fault's effect ("fault")."""
    head = (f"{metric} {_fmt(value)} > {bound_s:g}s with fault(s) {', '.join(in_place)} in place, and the recompute "
            f"twin, which no fault touches," if in_place else
            f"{metric} {_fmt(value)} > {bound_s:g}s with no fault in place, and the recompute twin")
    if timing is not None and timing.outcome == "ok":
        t = timing.latency_s if metric == "latency" else timing.ttft_s
        if t is not None and t > 0:
            ratio = value / t
            if ratio <= K_TWIN:
                return Judgement(**base, verdict="host_load", faults=in_place, twin_s=t, twin_ratio=ratio,
                                 reason=f"{head} took {_fmt(t)} for {prompt} (x{ratio:.1f} <= {K_TWIN:g})")
            if in_place:
                return Judgement(**base, verdict="fault", faults=in_place, twin_s=t, twin_ratio=ratio,
                                 reason=f"fault(s) {', '.join(in_place)} in place during its life, and the recompute "
                                 f"twin answered {prompt} in {_fmt(t)} (x{ratio:.1f} > {K_TWIN:g})")
            return Judgement(**base, verdict="failed", twin_s=t, twin_ratio=ratio,
                             reason=f"{metric} {_fmt(value)} > {bound_s:g}s with no fault in place while the "
                             f"recompute twin answered {prompt} in {_fmt(t)} (x{ratio:.1f} > {K_TWIN:g})")
    if timing is not None and timing.outcome == "info" and timing.waited_s >= value:
        return Judgement(**base, verdict="host_load", faults=in_place, twin_timed_out=True, twin_s=timing.waited_s,
                         reason=f"{head} gave no answer for {prompt} within {timing.waited_s:.1f}s")
    return None


def judge(rec: RequestRecord, metric: Metric, bound_s: float, everyone: Sequence[RequestRecord],
          windows: Sequence[FaultWindow], twin: TwinBaseline | None) -> Judgement:
    """Judge one request whose ``metric`` went past ``bound_s`` (the module doc's rule).

    Args:
        rec: the slow request.
        metric: ``latency`` (liveness, SLO latency bounds) or ``ttft`` (SLO TTFT bounds).
        bound_s: the deadline or SLO bound it went past (s).
        everyone: every request of the run (peers are taken from ``rec``'s phase).
        windows: ``fault_windows(history)``.
        twin: the runner's twin measurement (None: not measured).
    Returns:
        the judgement with its figures.
    """
    value = metric_of(rec, metric)
    base = dict(request_id=rec.request_id, phase=rec.phase, metric=metric, value_s=value, bound_s=bound_s)
    if rec.outcome is None or value is None:
        return Judgement(**base, verdict="failed", reason="never completed")
    in_place = faults_during(rec, windows)
    timing, prompt = twin_for(rec, metric, everyone, twin)
    by_twin = _by_twin(base, metric, value, bound_s, in_place, timing, prompt)
    if by_twin is not None:
        return by_twin
    if in_place:
        return Judgement(**base, verdict="fault", faults=in_place,
                         reason=f"fault(s) {', '.join(in_place)} in place during its life")
    peers = [p for p in everyone if p.request_id != rec.request_id and p.phase == rec.phase
             and p.outcome == "ok" and metric_of(p, metric) is not None and not faults_during(p, windows)
             and metric_of(p, metric) <= bound_s]  # type: ignore[operator]
    peer_vals = [metric_of(p, metric) for p in peers]
    median = statistics.median(peer_vals) if peer_vals else None  # type: ignore[type-var]
    base.update(peers=len(peers), peers_median_s=median)
    why_no_twin = ("no twin figure for its prompt"
                   + (f" ({twin.error})" if twin is not None and twin.error else "")
                   + (f" (twin: {timing.error})" if timing is not None and timing.error else ""))
    if len(peers) >= MIN_PEERS and median is not None and median >= bound_s / K_PEERS:
        return Judgement(**base, verdict="host_load",
                         reason=f"{metric} {_fmt(value)} > {bound_s:g}s with no fault in place; {why_no_twin}, and "
                         f"the {len(peers)} fault-free peers of phase {rec.phase} took {_fmt(median)} (median, "
                         f">= {bound_s:g}s / {K_PEERS:g})")
    peer_txt = (f"{len(peers)} fault-free peers of phase {rec.phase}, median {_fmt(median)}" if peers
                else f"no fault-free peer of phase {rec.phase} completed within the bound")
    return Judgement(**base, verdict="failed",
                     reason=f"{metric} {_fmt(value)} > {bound_s:g}s with no fault in place; {why_no_twin}, and "
                     f"no baseline as slow ({peer_txt}; host load needs >= {MIN_PEERS} with median >= "
                     f"{bound_s / K_PEERS:.1f}s)")


def wanted(slow: Iterable[RequestRecord]) -> list[RequestRecord]:
    """The slow requests whose judgement would read the twin: every one that completed, with a
    fault in place or not (only the twin can excuse a request a fault was in place for)."""
    return [r for r in slow if r.outcome is not None]


def rule_text() -> dict[str, Any]:
    """The rule's thresholds, for a report's details."""
    return {"k_twin": K_TWIN, "k_peers": K_PEERS, "min_peers": MIN_PEERS}
