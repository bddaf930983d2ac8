"""Timeline layout for report.html: one record of faults and requests, as Jepsen draws it.

    t=0 ───────────────────────────────────────────────> s since run start
    phases   [ warm        ][ stall              ][ heal ]
    faults                  [latency engine-lmcache]          (band spans all rows below)
    client-0  ▭▭ ▭▭▭ ▭ ▭▭▭▭  (bars coloured by request class, failures marked ✕,
    client-1  ▭▭▭ ▭▭ ▭▭▭      wrong outputs marked ▼)

The layout is computed here in Python (plain numbers), the template only draws rectangles, so
the page is one self-contained inline SVG.
"""

from __future__ import annotations

import math
import re
from typing import Any, Iterable

from pydantic import BaseModel, Field

from chaos.checks.requests import RequestRecord, requests
from chaos.report.model import RunResult

CLASS_COLOURS: dict[str, str] = {
    "cold_miss": "#9aa5b1",
    "local_hit": "#4c9be8",
    "lmcache_hit_full": "#2f9e44",
    "lmcache_hit_partial": "#94d82d",
    "lookup_timeout": "#f59f00",
    "load_failure_recompute": "#ae3ec9",
    "failed": "#e03131",
    "aborted": "#495057",
    "in_flight": "#ffffff",
}

LABEL_W = 130.0   # px left of the plot for row labels
PLOT_W = 1080.0   # px of plot width
AXIS_H = 22.0
PHASE_H = 20.0
FAULT_H = 16.0
GAP = 6.0


class Bar(BaseModel):
    """A request bar (px) with what its tooltip says."""

    x: float
    y: float
    w: float
    h: float
    request_id: str
    request_class: str
    colour: str
    failed: bool = False
    wrong: bool = False
    in_flight: bool = False
    title: str


class Band(BaseModel):
    """A fault: its row bar and the translucent band across the request rows (px)."""

    x: float
    w: float
    y: float
    h: float
    band_y: float
    band_h: float
    label: str
    bit: bool
    healed: bool
    title: str


class PhaseBox(BaseModel):
    """A phase box on the phase row, with a boundary line across the plot (px)."""

    x: float
    w: float
    name: str
    shade: str


class Tick(BaseModel):
    """An axis tick (px) and its label (s)."""

    x: float
    label: str


class RowLabel(BaseModel):
    """A row label (px)."""

    y: float
    text: str


class Marker(BaseModel):
    """A service exit: vertical line across the plot (px)."""

    x: float
    label: str
    by_fault: bool


class Timeline(BaseModel):
    """Everything report.html's SVG draws, in px."""

    width: float
    height: float
    label_w: float = LABEL_W
    plot_top: float
    plot_bottom: float
    t_max: float
    ticks: list[Tick] = Field(default_factory=list)
    phases: list[PhaseBox] = Field(default_factory=list)
    faults: list[Band] = Field(default_factory=list)
    bars: list[Bar] = Field(default_factory=list)
    rows: list[RowLabel] = Field(default_factory=list)
    markers: list[Marker] = Field(default_factory=list)
    classes: dict[str, str] = Field(default_factory=dict)


def nice_step(span: float, target: int = 10) -> float:
    """Axis tick step (1, 2 or 5 x 10^k s) giving about `target` ticks over `span` s."""
    if span <= 0:
        return 1.0
    raw = span / target
    mag = 10 ** math.floor(math.log10(raw))
    for m in (1, 2, 5, 10):
        if m * mag >= raw:
            return m * mag
    return 10 * mag


def _proc_key(p: str) -> tuple[int, str]:
    m = re.search(r"(\d+)$", p)
    return (int(m.group(1)) if m else 1 << 30, p)


def build_timeline(result: RunResult, history: Iterable[Any]) -> Timeline:
    """Lay out the run's phases, faults, requests and service exits.

    Args:
        result: the run (faults, phases, checks for wrong-output request ids, service exits).
        history: the run's ops (for the request bars).
    Returns:
        Timeline in px; rows: one per client process.
    """
    reqs: list[RequestRecord] = requests(history)
    wrong: set[str] = set()
    for chk in result.checks:
        for m in chk.details.get("mismatches", []) if chk.name == "recompute_equivalence" else []:
            wrong.add(str(m.get("request_id")))
    times = [0.0] + [r.invoke_time for r in reqs] + [r.end_time for r in reqs if r.end_time is not None]
    times += [p.end for p in result.phases] + [e.time for e in result.service_exits]
    times += [t for f in result.faults for t in (f.applied_at, f.healed_at) if t is not None]
    t_max = max(times) * 1.02 or 1.0

    def sx(t: float) -> float:
        return LABEL_W + PLOT_W * max(0.0, min(t, t_max)) / t_max

    tl = Timeline(width=LABEL_W + PLOT_W + 20, height=0, plot_top=AXIS_H, plot_bottom=0, t_max=t_max)
    step = nice_step(t_max)
    k = 0
    while k * step <= t_max:
        t = k * step
        tl.ticks.append(Tick(x=sx(t), label=f"{t:g}s"))
        k += 1
    y = AXIS_H
    tl.rows.append(RowLabel(y=y + PHASE_H / 2, text="phases"))
    for i, p in enumerate(result.phases):
        nxt = result.phases[i + 1].start if i + 1 < len(result.phases) else max(p.end, t_max / 1.02)
        tl.phases.append(PhaseBox(x=sx(p.start), w=max(1.0, sx(nxt) - sx(p.start)), name=p.name,
                                  shade="#e9ecef" if i % 2 == 0 else "#dee2e6"))
    y += PHASE_H + GAP
    fault_rows: list[tuple[float, Any]] = []
    for f in result.faults:
        tl.rows.append(RowLabel(y=y + FAULT_H / 2, text=f.kind or "fault"))
        fault_rows.append((y, f))
        y += FAULT_H + 2
    y += GAP
    # One row per client process; a request that overlaps an earlier one of the same process
    # (the workload reused a process name) goes to an extra lane under it, so no bar hides another.
    procs = sorted({r.process for r in reqs}, key=_proc_key)
    lane_ends: dict[str, list[float]] = {p: [] for p in procs}
    lane_of: dict[str, int] = {}
    for r in sorted(reqs, key=lambda r: r.invoke_time):
        end = r.end_time if r.end_time is not None else t_max
        ends = lane_ends[r.process]
        lane = next((i for i, e in enumerate(ends) if e <= r.invoke_time), len(ends))
        if lane == len(ends):
            ends.append(end)
        else:
            ends[lane] = end
        lane_of[r.request_id] = lane
    n_lanes = sum(max(1, len(lane_ends[p])) for p in procs)
    row_h = max(5.0, min(14.0, 480.0 / max(1, n_lanes)))
    row_of: dict[str, float] = {}
    for p in procs:
        row_of[p] = y
        tl.rows.append(RowLabel(y=y + row_h / 2, text=p))
        y += max(1, len(lane_ends[p])) * (row_h + 2)
    bottom = y
    for r in reqs:
        cls = r.request_class or "in_flight"
        end = r.end_time if r.end_time is not None else t_max
        s = r.cached_token_stats
        hit = (f", hit local {s.local_cache_hit_tokens} + LMCache {s.external_cache_hit_tokens} tokens"
               if s else "")
        lat = f"{r.latency_s:.2f}s" if r.latency_s is not None else "never completed"
        err = f", error: {r.error}" if r.error else ""
        tl.bars.append(Bar(
            x=sx(r.invoke_time), y=row_of[r.process] + lane_of[r.request_id] * (row_h + 2), w=max(1.5, sx(end) - sx(r.invoke_time)), h=row_h,
            request_id=r.request_id, request_class=cls, colour=CLASS_COLOURS.get(cls, "#868e96"),
            failed=cls == "failed", wrong=r.request_id in wrong, in_flight=r.end_time is None,
            title=(f"{r.request_id} [{cls}] phase {r.phase}, t={r.invoke_time:.2f}s, {lat}{hit}{err}"
                   + (" — OUTPUT DIFFERS FROM RECOMPUTE" if r.request_id in wrong else ""))))
    for fy, f in fault_rows:
        start = f.applied_at if f.applied_at is not None else 0.0
        end = f.healed_at if f.healed_at is not None else t_max
        params = ", ".join(f"{k}={v}" for k, v in f.params.items())
        tl.faults.append(Band(
            x=sx(start), w=max(2.0, sx(end) - sx(start)), y=fy, h=FAULT_H, band_y=fy,
            band_h=bottom - fy, label=f"{f.kind} {f.fault_id}".strip(), bit=f.bit, healed=f.healed_at is not None,
            title=(f"{f.kind} {f.fault_id} ({params}) applied {start:.2f}s, "
                   + (f"healed {f.healed_at:.2f}s" if f.healed_at is not None else "never healed")
                   + f", evidence {f.evidence}"
                   + ("" if f.trigger is None else
                      f", trigger {'reached' if f.trigger.get('reached') else 'NOT REACHED'}: "
                      + "; ".join(str(c.get("condition")) for c in f.trigger.get("conditions") or [])))))
    for e in result.service_exits:
        tl.markers.append(Marker(x=sx(e.time), label=f"{e.service} exit {e.returncode}", by_fault=e.killed_by_fault))
    present = {b.request_class for b in tl.bars}
    tl.classes = {c: col for c, col in CLASS_COLOURS.items() if c in present}
    tl.plot_bottom = bottom
    tl.height = bottom + 12
    return tl
