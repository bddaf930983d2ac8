from __future__ import annotations

import asyncio
import json
import threading

import pytest

from chaos.history import HistoryError, HistoryWriter, Op, load_history


class _Clock:
    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t


def test_append_and_load(tmp_path):
    clock = _Clock()
    path = tmp_path / "run" / "history.jsonl"
    with HistoryWriter(path, clock=clock) as h:
        clock.t = 101.5
        a = h.append("client-0", "invoke", "complete", phase="warm", request_id="r1", value={"x": 1})
        # written through at once: a killed run keeps it
        assert json.loads(path.read_text())["request_id"] == "r1"
        clock.t = 102.0
        h.append("nemesis", "ok", "apply", phase="warm", fault_id="latency-0", value={"bit": True})
    assert (a.index, a.time, a.process) == (0, 1.5, "client-0")
    ops = load_history(path)
    assert ops == h.ops
    assert ops[1] == Op(index=1, time=2.0, process="nemesis", type="ok", f="apply", phase="warm",
                        fault_id="latency-0", value={"bit": True})
    with pytest.raises(ValueError, match="closed"):
        h.append("client-0", "ok", "complete")


def test_bad_values_write_nothing(tmp_path):
    h = HistoryWriter(tmp_path / "h.jsonl")
    with pytest.raises(Exception):
        h.append("client-0", "invoke", "complete", value={"x": object()})
    with pytest.raises(Exception):
        h.append("client-0", "begin", "complete")  # type: ignore[arg-type]
    h.append("client-0", "invoke", "complete")
    h.close()
    assert [o.index for o in load_history(tmp_path / "h.jsonl")] == [0]


def test_truncated_last_line_is_dropped_other_bad_lines_are_errors(tmp_path):
    path = tmp_path / "h.jsonl"
    with HistoryWriter(path) as h:
        for i in range(3):
            h.append(f"client-{i}", "invoke", "complete", request_id=str(i))
    text = path.read_text()
    path.write_text(text[: len(text) - 10])  # killed mid-write
    assert [o.request_id for o in load_history(path)] == ["0", "1"]
    lines = text.splitlines()
    path.write_text("\n".join([lines[0], "{not json", lines[2]]) + "\n")
    with pytest.raises(HistoryError, match=r"h.jsonl:2: "):
        load_history(path)


def test_threads_and_tasks_get_distinct_ordered_indexes(tmp_path):
    h = HistoryWriter(tmp_path / "h.jsonl")

    def worker(n):
        for i in range(200):
            h.append(f"client-{n}", "invoke", "complete", request_id=f"{n}-{i}")

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()

    async def tasks():
        async def one(i):
            await asyncio.sleep(0)
            h.append("nemesis", "info", "apply", fault_id=str(i))

        await asyncio.gather(*(one(i) for i in range(100)))

    asyncio.run(tasks())
    for t in threads:
        t.join()
    h.close()
    ops = load_history(tmp_path / "h.jsonl")
    assert [o.index for o in ops] == list(range(900))
    assert all(a.time <= b.time for a, b in zip(ops, ops[1:]))


def test_in_memory():
    h = HistoryWriter()
    h.append("client-0", "invoke", "complete")
    assert len(h.ops) == 1 and h.path is None
