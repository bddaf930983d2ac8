"""The journal records each add and each undo once, and open_entries() is what is left."""

from __future__ import annotations

import json

from chaos.journal import Journal, open_entries
from kvchaos_support import local_stack


def lines(j: Journal) -> list[dict]:
    """The journal's entries (not the owner lines)."""
    return [e for e in (json.loads(x) for x in j.path.read_text().splitlines()) if e["op"] != "owner"]


def test_open_entries_are_added_and_not_removed(tmp_path):
    j = Journal("r", directory=tmp_path)
    j.add("process", "a:1", pid=1)
    j.add("mount", "/m", path="/m")
    j.remove("process", "a:1")
    assert [(e["kind"], e["key"]) for e in open_entries(j.path)] == [("mount", "/m")]
    j.remove("mount", "/m")
    j.close()
    assert not j.path.exists()


def test_a_repeated_remove_is_written_once_and_a_re_add_opens_it_again(tmp_path):
    j = Journal("r", directory=tmp_path)
    j.add("process", "a:1", pid=1)
    for _ in range(5):
        j.remove("process", "a:1")
    assert [e["op"] for e in lines(j)] == ["add", "remove"]
    j.add("process", "a:1", pid=1)  # the same key again (a restarted service reusing a pid)
    assert open_entries(j.path) != []
    j.remove("process", "a:1")
    assert [e["op"] for e in lines(j)] == ["add", "remove", "add", "remove"]
    assert open_entries(j.path) == []


def test_status_polls_of_a_killed_service_write_one_remove(tmp_path):
    """The input that showed it: each status() of a dead service appended (and fsynced) another
    remove line for it; a journal of the reference stack held six for one LMCache kill."""
    stack = local_stack(tmp_path, "services:\n  idle:\n    command: [sleep, '300']\n    stop_signal: SIGKILL\n")
    with stack:
        pid = stack.status()["idle"].pid
        stack.kill("idle")
        for _ in range(5):
            stack.status()
        removes = [e for e in lines(stack.journal) if e["op"] == "remove" and e["key"] == f"idle:{pid}"]
        assert len(removes) == 1
