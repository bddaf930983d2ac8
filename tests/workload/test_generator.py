from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chaos.workload.generator import TOKEN_HIGH, TOKEN_LOW, family_prefix, plan_phase, prompt_hash
from chaos.workload.spec import WorkloadSpec


def test_prefixes_are_shared_per_family_and_across_phases():
    spec = WorkloadSpec(families=3, prefix_tokens=[255, 256, 257], suffix_tokens=5, requests=9)
    warm = plan_phase(spec, seed=7, phase="warm")
    stall = plan_phase(spec, seed=7, phase="stall")
    for phase in (warm, stall):
        assert [c.family for c in phase] == [0, 1, 2] * 3
        for c in phase:
            (t,) = c.turns
            n = [255, 256, 257][c.family]
            assert t.prefix_len == n and len(t.user_tokens) == n + 5
            assert t.user_tokens[:n] == family_prefix(7, c.family, n)
    # same family, different suffix within and across phases
    suffixes = {tuple(c.turns[0].user_tokens[-5:]) for p in (warm, stall) for c in p}
    assert len(suffixes) == 18
    assert [t.request_id for c in warm for t in c.turns][:2] == ["warm-0-0", "warm-1-0"]


def test_deterministic_in_seed():
    spec = WorkloadSpec(families=2, requests=6, stream=0.5)
    assert plan_phase(spec, 1, "p") == plan_phase(spec, 1, "p")
    assert plan_phase(spec, 1, "p") != plan_phase(spec, 2, "p")


def test_tenants_cover_every_family():
    spec = WorkloadSpec(families=2, tenants=3, requests=6)
    pairs = {(c.family, c.cache_salt) for c in plan_phase(spec, 0, "p")}
    assert pairs == {(f, f"tenant-{t}") for f in range(2) for t in range(3)}
    spec = WorkloadSpec(families=1, tenants=["a", "b"], requests=2)
    assert [c.cache_salt for c in plan_phase(spec, 0, "p")] == ["a", "b"]
    assert {c.cache_salt for c in plan_phase(WorkloadSpec(requests=3), 0, "p")} == {None}


def test_turns_and_request_count():
    spec = WorkloadSpec(turns=3, requests=7, suffix_tokens=4, prefix_tokens=10, families=1)
    convs = plan_phase(spec, 0, "p")
    assert [len(c.turns) for c in convs] == [3, 3, 1]
    later = convs[0].turns[1]
    assert later.turn == 1 and len(later.user_tokens) == 4  # only the new user text
    assert plan_phase(spec, 0, "p", requests=0) == []
    with pytest.raises(ValueError):
        plan_phase(spec, 0, "p", requests=-1)


def test_stream_fraction():
    def streamed(fraction):
        spec = WorkloadSpec(requests=400, stream=fraction)
        return sum(t.stream for c in plan_phase(spec, 3, "p") for t in c.turns)

    assert streamed(False) == 0 and streamed(True) == 400 and streamed(1.0) == 400
    assert 150 < streamed(0.5) < 250


def test_prompt_hash():
    assert prompt_hash([1, 2, 3]) == prompt_hash([1, 2, 3]) != prompt_hash([1, 2, 4])
    assert prompt_hash([12, 3]) != prompt_hash([1, 23]) and len(prompt_hash([])) == 16


@settings(max_examples=200, deadline=None)
@given(
    families=st.integers(1, 5),
    prefixes=st.lists(st.integers(0, 600), min_size=1, max_size=4),
    suffix=st.integers(0, 50),
    turns=st.integers(1, 4),
    requests=st.integers(0, 30),
    seed=st.integers(0, 2**32),
)
def test_exact_lengths_and_ids(families, prefixes, suffix, turns, requests, seed):
    spec = WorkloadSpec(families=families, prefix_tokens=prefixes, suffix_tokens=suffix, turns=turns,
                        requests=requests)
    convs = plan_phase(spec, seed, "x")
    plans = [t for c in convs for t in c.turns]
    assert len(plans) == requests
    assert len({t.request_id for t in plans}) == requests
    for t in plans:
        expected = spec.prefix_lengths[t.family] + suffix if t.turn == 0 else suffix
        assert len(t.user_tokens) == expected
        assert all(TOKEN_LOW <= x <= TOKEN_HIGH for x in t.user_tokens)
