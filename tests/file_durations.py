"""Longest-file-first order for ``make test``'s non-chaos stage (pytest-xdist ``--dist loadfile``).

Under ``--dist loadfile`` a test file is one unit of work on one worker, and the workers take
units in the order of the collection (with ``--no-loadscope-reorder``; without it xdist sorts
the files by their number of tests). A long file handed out late leaves one worker busy and the
others idle at the end of the stage. Handing out the longest files first (LPT, longest
processing time first) bounds that tail by the shortest files instead.

- ``file_durations.json`` (beside this module): seconds per test file (setup + call + teardown
  of its tests, as a junit xml records them), from a ``make test`` run.
- ``order_by_duration(keys, seconds)``: the order of the collection, longest file first; a file
  not in the table goes first (see there); ties and each file's own tests keep their order.
  ``tests/conftest.py`` applies it under ``--dist loadfile`` when the table exists.
- ``python tests/file_durations.py record JUNIT_XML``: update the table from a junit xml (files
  the run skipped keep their old time; ``make record-durations`` does it from
  ``reports/junit-tests.xml``, which ``make test`` writes).
- ``python tests/file_durations.py simulate JUNIT_XML [--workers N ...]``: the stage's wall time
  that xdist's scheduling would give for those durations, in the order of xdist's own reorder
  and longest-file-first (a model: a worker takes the next file when its pending tests fall to
  two, as ``xdist.scheduler.loadscope`` does; the durations are those of the recorded run, so a
  change of worker count on saturated cores is not modelled).
"""

from __future__ import annotations

import argparse
import heapq
import json
import sys
import xml.etree.ElementTree as ET
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

TABLE = Path(__file__).with_name("file_durations.json")

T = TypeVar("T")


def file_of(nodeid: str) -> str:
    """The test file of a pytest node id (``tests/a/test_b.py::test_c[x]`` -> ``tests/a/test_b.py``),
    the unit ``--dist loadfile`` schedules."""
    return nodeid.split("::", 1)[0]


#: The test files whose scenario runs on compose/reference.yml share one StackPool for the whole
#: session (tests/conftest.py ``reference_pool``). Under ``--dist loadfile`` they are one unit
#: of work (:func:`scope_of`, tests/conftest.py pytest_xdist_make_scheduler): one worker runs them
#: one after the other, so a file gets the stack the one before left (reset as a suite resets it
#: between scenarios, or started afresh after a run that disrupted it, chaos/runner/stacks.py)
#: instead of a stack start of its own: about 50 CPU-seconds each (engine, recompute twin, two
#: LMCache servers, Redis, proxy; measured 2026-12-07 on 2 cores).
REFERENCE_POOL_FILES = frozenset({
    "tests/faults/test_new_kinds_bite.py",
    "tests/faults/test_stall_and_lmcache_call.py",
    "tests/faults/test_reconnect.py",
    "tests/diagnose/test_diagnose_stack.py",
    "tests/checks/test_bites_on_reference_stack.py",
    "tests/shrink/test_shrink_stack.py",
    "tests/runner/test_tolerant_mode.py",
    "tests/catalogue/test_windows_under_load.py",
})
#: The unit of work of every file of REFERENCE_POOL_FILES.
REFERENCE_POOL_SCOPE = "reference-pool-files"


def scope_of(nodeid: str) -> str:
    """The unit of work ``--dist loadfile`` makes of a node id under tests/conftest.py's
    scheduler: :data:`REFERENCE_POOL_SCOPE` for a test of a file of
    :data:`REFERENCE_POOL_FILES`, else its file (xdist's own loadfile unit)."""
    f = file_of(nodeid)
    return REFERENCE_POOL_SCOPE if f in REFERENCE_POOL_FILES else f


def load_table(path: Path = TABLE) -> dict[str, float] | None:
    """The seconds per test file stored at ``path``; None when there is no such file.

    Raises ValueError naming the file when it is not a JSON object of numbers."""
    if not path.is_file():
        return None
    try:
        table = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}:{exc.lineno}: not JSON: {exc.msg}") from exc
    if not isinstance(table, dict) or not all(isinstance(v, int | float) for v in table.values()):
        raise ValueError(f"{path}: expected a JSON object of test file -> seconds")
    return {str(k): float(v) for k, v in table.items()}


def order_by_duration(entries: Sequence[T], seconds: dict[str, float], key: Callable[[T], str] = file_of) -> list[T]:
    """``entries`` (test items or node ids) grouped by file, longest file first.

    ``key`` gives an entry's file. A file missing from ``seconds`` (new, or skipped in the run
    recorded) goes before every listed one: were it long, handed out last it would be the tail;
    handed out first it costs at most its own time. The sort is stable: files of equal time
    keep their first-seen order and a file's entries keep theirs."""
    first_seen: dict[str, int] = {}
    for entry in entries:
        first_seen.setdefault(key(entry), len(first_seen))

    def rank(entry: T) -> tuple[bool, float, int]:
        f = key(entry)
        return (f in seconds, -seconds.get(f, 0.0), first_seen[f])

    return sorted(entries, key=rank)


def merge_table(old: dict[str, float], new: dict[str, float], root: Path) -> dict[str, float]:
    """``new`` over ``old``: a file the new run did not time (skipped there, e.g. no Docker)
    keeps its old seconds; a file no longer under ``root`` is dropped. Sorted by file."""
    merged = {**old, **new}
    return {f: merged[f] for f in sorted(merged) if (root / f).is_file()}


def junit_test_seconds(xml_path: Path, root: Path) -> dict[str, list[float]]:
    """Seconds of each test (junit ``time``: setup + call + teardown) by file, from a pytest
    junit xml; ``classname`` (``tests.a.test_b`` or ``tests.a.test_b.TestC``) is mapped to the
    longest dotted prefix that is a ``.py`` file under ``root``; entries that name no file (a
    skipped collection: ``classname=""``) are left out.

    Returns ``{file: [seconds of each test, in the xml's order]}``."""
    per_file: dict[str, list[float]] = {}
    cache: dict[str, str] = {}
    for case in ET.parse(xml_path).getroot().iter("testcase"):
        classname = case.get("classname", "")
        if classname not in cache:
            cache[classname] = _module_file(classname, root)
        if cache[classname]:
            per_file.setdefault(cache[classname], []).append(float(case.get("time", 0) or 0))
    return per_file


def _module_file(classname: str, root: Path) -> str:
    parts = classname.split(".") if classname else []
    for n in range(len(parts), 0, -1):
        candidate = "/".join(parts[:n]) + ".py"
        if (root / candidate).is_file():
            return candidate
    return ""


def simulate(units: Sequence[tuple[str, Sequence[float]]], workers: int) -> float:
    """Wall time (s) of ``units`` (file, its tests' seconds in run order) handed out in the given
    order to ``workers`` workers the way ``xdist.scheduler.loadscope`` does: one unit each, then
    one more to each worker with two or fewer pending tests, then, each time a worker finishes a
    test, one more unit to it if it has two or fewer pending."""
    queue = list(units)
    pending: list[list[float]] = [[] for _ in range(workers)]

    def reschedule(w: int) -> None:
        if queue and len(pending[w]) <= 2:
            pending[w].extend(queue.pop(0)[1])

    for w in range(workers):
        if queue:
            pending[w].extend(queue.pop(0)[1])
    for w in range(workers):
        reschedule(w)
    events = [(pending[w].pop(0), w) for w in range(workers) if pending[w]]
    heapq.heapify(events)
    end = 0.0
    while events:
        now, w = heapq.heappop(events)  # worker w finished a test at ``now``
        end = max(end, now)
        reschedule(w)
        if pending[w]:
            heapq.heappush(events, (now + pending[w].pop(0), w))
    return end


def _main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="tests/file_durations.py", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    rec = sub.add_parser("record", help=f"rewrite {TABLE.name} from a junit xml")
    rec.add_argument("junit_xml", type=Path)
    sim = sub.add_parser("simulate", help="the stage's wall time for a junit xml's durations")
    sim.add_argument("junit_xml", type=Path)
    sim.add_argument("--workers", type=int, nargs="+", default=[3, 4])
    args = parser.parse_args(argv)
    root = TABLE.parent.parent
    if not args.junit_xml.is_file():
        print(f"{args.junit_xml}: no such junit xml (make test writes reports/junit-tests.xml)", file=sys.stderr)
        return 2
    per_test = junit_test_seconds(args.junit_xml, root)
    totals = {f: round(sum(t), 1) for f, t in per_test.items()}
    if args.command == "record":
        table = merge_table(load_table() or {}, totals, root)
        TABLE.write_text(json.dumps(table, indent=1) + "\n")
        print(f"{TABLE}: {len(table)} files ({len(totals)} timed by {args.junit_xml}), {sum(table.values()):.0f} s in all")
        return 0
    by_count = sorted(per_test.items(), key=lambda kv: -len(kv[1]))  # xdist's default reorder
    lpt = order_by_duration(list(per_test.items()), totals, key=lambda kv: kv[0])
    print(f"{len(totals)} files, {sum(totals.values()):.0f} s of tests; longest file {max(totals.values()):.0f} s")
    for n in args.workers:
        print(
            f"{n} workers: by number of tests (xdist's default) {simulate(by_count, n):.0f} s, "
            f"longest file first {simulate(lpt, n):.0f} s, lower bound {max(sum(totals.values()) / n, max(totals.values())):.0f} s"
        )
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
