"""Seeded requests: shared-prefix families, distinct suffixes, tenants, conversations.

    family f:   [ prefix_f (prefix_lengths[f] tokens, shared) ][ suffix (suffix_tokens) ]
    turn k>0:   [ prompt of turn k-1 ][ its output ][ new user text (suffix_tokens) ]

Prompts are token ids. The reference engine's tokenizer is byte-level (one token per byte), so
ids are bytes; we draw printable ASCII (32..126) so logs stay readable and no id is a control
or special token. Everything is a function of (seed, phase, indexes): the same scenario sends
the same prompts, and the recompute twin can replay them exactly.
"""

from __future__ import annotations

import hashlib
import math
import random
from dataclasses import dataclass, field

from chaos.workload.spec import WorkloadSpec

__all__ = ["TurnPlan", "Conversation", "plan_phase", "family_prefix", "prompt_hash", "TOKEN_LOW", "TOKEN_HIGH"]

TOKEN_LOW = 32
TOKEN_HIGH = 126


def _tokens(rng: random.Random, n: int) -> list[int]:
    return [rng.randint(TOKEN_LOW, TOKEN_HIGH) for _ in range(n)]


def family_prefix(seed: int, family: int, length: int) -> list[int]:
    """The shared prefix of ``family`` (``length`` token ids); the same in every phase."""
    return _tokens(random.Random(f"kvchaos:{seed}:family:{family}"), length)


def prompt_hash(token_ids: list[int]) -> str:
    """Short stable hash of a prompt's token ids: sha256 of "id,id,...", 16 hex digits."""
    return hashlib.sha256(",".join(map(str, token_ids)).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class TurnPlan:
    """One request of a conversation, before it is sent.

    ``user_tokens`` is what this turn adds: for turn 0 the family prefix + suffix, for later
    turns the new user text (appended after the previous prompt and its output).
    """

    request_id: str
    conversation: int
    turn: int
    family: int
    cache_salt: str | None
    user_tokens: list[int]
    prefix_len: int
    stream: bool
    max_tokens: int


@dataclass(frozen=True)
class Conversation:
    """Turns sent one after another (turn k waits for turn k-1's output)."""

    index: int
    family: int
    cache_salt: str | None
    turns: list[TurnPlan] = field(default_factory=list)


def plan_phase(spec: WorkloadSpec, seed: int, phase: str, requests: int | None = None) -> list[Conversation]:
    """The requests of one phase as conversations.

    Args:
        spec: the workload section.
        seed: the scenario seed.
        phase: phase name (suffixes differ per phase; family prefixes do not).
        requests: number of requests (default ``spec.requests``); 0 gives [].

    Returns:
        ``ceil(requests / turns)`` conversations with ``requests`` turns in all (the last may be
        shorter). Conversation c uses family ``c % families`` and tenant
        ``(c // families) % tenants``, so every family is sent by every tenant. Request ids are
        ``<phase>-<c>-<turn>``.

    Raises:
        ValueError: ``requests`` < 0.
    """
    n = spec.requests if requests is None else requests
    if n < 0:
        raise ValueError(f"requests must be >= 0 (got {n})")
    lengths = spec.prefix_lengths
    salts = spec.salts
    prefixes = {f: family_prefix(seed, f, lengths[f]) for f in range(spec.families)}
    conversations: list[Conversation] = []
    remaining = n
    for c in range(math.ceil(n / spec.turns) if n else 0):
        family = c % spec.families
        salt = salts[(c // spec.families) % len(salts)]
        rng = random.Random(f"kvchaos:{seed}:phase:{phase}:conversation:{c}")
        turns: list[TurnPlan] = []
        for t in range(min(spec.turns, remaining)):
            suffix = _tokens(rng, spec.suffix_tokens)
            stream = rng.random() < spec.stream_fraction
            turns.append(
                TurnPlan(
                    request_id=f"{phase}-{c}-{t}",
                    conversation=c,
                    turn=t,
                    family=family,
                    cache_salt=salt,
                    user_tokens=(prefixes[family] + suffix) if t == 0 else suffix,
                    prefix_len=lengths[family],
                    stream=stream,
                    max_tokens=spec.max_tokens,
                )
            )
        remaining -= len(turns)
        conversations.append(Conversation(index=c, family=family, cache_salt=salt, turns=turns))
    return conversations
