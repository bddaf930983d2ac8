"""Faults: one class per kind, with a params model that is also its YAML schema.

    scenario YAML ─ {kind: latency, link: ..., start: 2s, duration: 8s}
                         │  (the registry's discriminated union on `kind`)
                         ▼
                    LatencyParams ──> Latency(params).apply(ctx) ... heal(ctx), evidence(ctx)
                                                   │
                         runner records apply/heal on the history ("nemesis" process)

A fault module defines a ``FaultParams`` subclass with ``kind: Literal["<kind>"]`` and a
``Fault`` subclass decorated with ``@register("<kind>")`` (chaos/faults/registry.py). Nothing
else needs editing: the scenario model, the JSON schema and the docs test pick it up.

What a kind needs from the stack is declared on its ``Fault`` class, so that ``kvchaos
validate --stack`` / ``list --stack`` / ``run`` refuse a scenario before anything starts on a
stack that cannot run it (exit 2, naming the missing capability):

- ``needs = ("engine.hooks.stall",)``: capability names every fault of the kind needs, from
  chaos/stack/capabilities.py (add a name there, with one line saying what it means, when a
  kind needs something new; stack files that offer it list it under
  ``x-kvchaos.capabilities``). ``"a|b"`` means either one will do.
- ``capability_needs(params)`` (a classmethod): override when the needs depend on the
  settings (``preempt`` via ``hook`` or ``pool``, ``l2_corrupt``'s ``target``); the default
  returns ``needs``.
Links and services a fault names are checked on their own (``stack_refs``).

What it means, for a kind, that a fault reached the system under test is its *default trigger*
(:class:`DefaultTrigger`, from ``default_trigger(params)``, or ``default_trigger_beside(params,
beside)`` where the window depends on the phase's other faults): used when the scenario declares no
``trigger`` of its own, evaluated by the `evidence` check from the history, and reported as the
default ("trigger (default for latency): ..."). A new kind inherits "its own evidence is the
window" unless it says more.
"""

from __future__ import annotations

import random
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal, Sequence

from pydantic import ConfigDict, Field, model_validator

from chaos.duration import Duration, PositiveDuration
from chaos.probes import Triggered, TriggerSpec, reason_field, trigger_field

if TYPE_CHECKING:  # only for type hints; each is written by another layer
    from chaos.history import HistoryWriter
    from chaos.proxy.client import ToxiproxyClient

__all__ = ["FaultParams", "Fault", "FaultContext", "FAULT_ID_PATTERN", "DefaultTrigger", "TRIGGER_BASES"]

FAULT_ID_PATTERN = r"^[a-z0-9][a-z0-9_-]*$"


class FaultParams(Triggered):
    """Fields every fault has. Subclasses add ``kind: Literal["<kind>"]`` and their settings.

    ``start`` is seconds after its phase starts (``after: requests``: after the phase's requests
    are done); the fault is healed ``duration`` seconds after it is applied, or when the phase
    ends (after its requests are done) with ``until: end``. ``hold_requests``: the phase's
    requests not yet sent when the fault is due wait until its apply returns (the runner's
    request gate, chaos/runner/run.py ``_run_phase``), and its ``duration`` counts from then.
    """

    model_config = ConfigDict(extra="forbid")

    kind: str = Field(description="the fault kind (the name it is registered under)")
    name: str | None = Field(
        default=None,
        pattern=FAULT_ID_PATTERN,
        description="fault id in the history and report; default <kind>-<index>, index counted "
        "over all faults of the scenario from 0",
    )
    start: Duration = Field(
        default=0.0, description="when to apply, after the phase starts (>= 0; e.g. 0s, 500ms, 2)"
    )
    after: Literal["phase_start", "requests"] = Field(
        default="phase_start",
        description="what `start` counts from: phase_start (default) or requests: once the phase's "
        "requests are done (e.g. kill a server after the requests that stored to it; needs a `duration`)",
    )
    hold_requests: bool = Field(
        default=False,
        description="the phase's requests not yet sent when the fault is due wait until it is in "
        "place, so requests still come after it however late its apply lands on a loaded host "
        "(those in flight go on: a kill at 200ms still meets them); its `duration` then counts from when "
        "it is in place; for a fault that starts mid-phase",
    )
    duration: PositiveDuration | None = Field(
        default=None, description="how long the fault lasts (> 0); exactly one of duration/until"
    )
    until: Literal["end"] | None = Field(
        default=None, description="`end`: the fault lasts until its phase ends"
    )
    trigger: TriggerSpec = trigger_field(
        "what must be seen while the fault is in place for the scenario to count (one "
        "condition or a list, all must be seen): a metric or JSON number of a service that grew_by "
        "or reached N, or a log line that matched; not seen: the run is inconclusive. Omitted: the "
        "kind's default trigger (docs/scenarios.md). `none` (with `reason`): nothing proves the "
        "window, and a run whose checks pass is 'passed (window not proven)'")
    reason: str | None = reason_field(
        "with `trigger: none`: why nothing can prove that this fault reached the system "
        "under test (required there, not allowed otherwise)")
    only_with: str | None = Field(
        default=None, min_length=1,
        description="this fault is part of the scenario only on stacks that offer this capability "
        "(chaos/stack/capabilities.py, e.g. engine.debug_state); elsewhere it is left out before the "
        "run and needs nothing")
    unless_with: str | None = Field(
        default=None, min_length=1,
        description="this fault is part of the scenario only on stacks that do NOT offer this "
        "capability: the stack-native form of a window another fault of the phase opens with "
        "`only_with` the same capability")

    def on_stack(self, capabilities: set[str]) -> bool:
        """True when this fault is part of the scenario on a stack offering ``capabilities``
        (``only_with`` offered, ``unless_with`` not)."""
        return ((self.only_with is None or self.only_with in capabilities)
                and (self.unless_with is None or self.unless_with not in capabilities))

    @model_validator(mode="after")
    def _known_gates(self) -> FaultParams:
        from chaos.stack.capabilities import CAPABILITIES, is_known

        for key in ("only_with", "unless_with"):
            cap = getattr(self, key)
            if cap is not None and not is_known(cap):
                raise ValueError(f"{key}: unknown capability {cap!r}; known: " + ", ".join(sorted(CAPABILITIES))
                                 + ", var:NAME")
        if self.only_with is not None and self.only_with == self.unless_with:
            raise ValueError("`only_with` and `unless_with` name the same capability: the fault would never run")
        return self

    @model_validator(mode="after")
    def _duration_or_until(self) -> FaultParams:
        if (self.duration is None) == (self.until is None):
            raise ValueError(
                "give exactly one of `duration` (e.g. 8s) or `until: end`"
                if self.duration is None
                else "give either `duration` or `until: end`, not both"
            )
        if self.after == "requests" and self.hold_requests:
            raise ValueError("`hold_requests` holds the phase's requests, which are done before a fault "
                             "`after: requests` starts: drop one of them")
        if self.after == "requests" and self.until is not None:
            raise ValueError("`after: requests` needs a `duration` (with `until: end` the fault would be "
                             "healed as soon as it is applied)")
        return self

    @property
    def id(self) -> str:
        """The fault id: ``name``, set by the scenario model to ``<kind>-<index>`` if omitted."""
        return self.name or self.kind

    def end_s(self) -> float | None:
        """Seconds after the phase start (``after: requests``: after the phase's requests are
        done) at which the fault is healed; None for ``until: end``."""
        return None if self.duration is None else self.start + self.duration

    def stack_refs(self) -> dict[str, str]:
        """Names this fault expects the stack to have, as {field: name}, e.g. {"link": "x"}.

        Kinds of reference: ``link`` (a link in x-kvchaos.links), ``service`` (a compose
        service). Checked by chaos.scenario.loader.validate_against_stack.
        """
        return {}


#: How a default trigger is judged from the history (chaos/checks/evidence.py):
#: ``evidence``: the fault's own evidence already is the window (it counts what the system under
#: test did: a preemption the engine counted, a load LMCache failed); ``requests_in_place``: a
#: request of the workload was in flight while the fault was in place; ``requests_from_apply``:
#: a request of the workload was in flight when the fault took effect or was sent after it (this
#: phase or a later one), so it met the outage or what the fault left behind.
TRIGGER_BASES = ("evidence", "requests_in_place", "requests_from_apply")


@dataclass(frozen=True)
class DefaultTrigger:
    """What it means, for one fault kind, that a fault reached the system under test.

    Attributes:
        basis: one of :data:`TRIGGER_BASES`.
        text: one line for reports ("a request of the workload crossed the link while ...").
        needs: capabilities (chaos/stack/capabilities.py; ``"a|b"``: either) the default needs
            to be observable; on a stack without one, validation warns that the default cannot
            apply (the run would be inconclusive).
        evidence_field: basis ``evidence`` only: the evidence must also hold a true or positive
            value under this key (``disk_full``: stores LMCache counted as failed, not only a
            full filesystem).
    """

    basis: Literal["evidence", "requests_in_place", "requests_from_apply"]
    text: str
    needs: frozenset[str] = frozenset()
    evidence_field: str | None = None

    def as_record(self, kind: str) -> dict[str, Any]:
        """What the runner records on the apply op (``value.default_trigger``)."""
        out: dict[str, Any] = {"kind": kind, "basis": self.basis, "text": self.text}
        if self.evidence_field:
            out["evidence_field"] = self.evidence_field
        return out


@dataclass
class FaultContext:
    """What a fault may touch while it is applied or healed.

    Attributes:
        proxy: client of the stack's Toxiproxy (network faults); None when the stack has none.
        stack: the running stack (chaos/stack/base.py interface: kill, pause, settings, env...).
        history: the run's history writer (the runner records apply/heal itself; faults may
            add ``info`` records of their own, e.g. each preempted request).
        rng: seeded from the scenario seed; the only randomness a fault may use.
        scenario_dir: folder of the scenario file (for paths a fault names).
        phase: name of the phase the fault belongs to.
        judges_service_exits: the scenario has a check that fails on a service exit no fault
            caused (liveness); without one, a fault must not leave such an exit for the
            verdict to ignore (chaos/faults/kill.py raises instead: unknown, never a pass).
    """

    proxy: ToxiproxyClient | None = None
    stack: Any = None
    history: HistoryWriter | None = None
    rng: random.Random = field(default_factory=lambda: random.Random(0))
    scenario_dir: Path = field(default_factory=Path.cwd)
    phase: str = ""
    judges_service_exits: bool = False


class Fault(ABC):
    """A fault of one kind, built from its validated params.

    The runner calls ``apply`` at ``start``, ``heal`` at the end (on every exit path, also when
    ``apply`` failed half-way, so ``heal`` must tolerate a fault that is not in place), and
    ``evidence`` after ``heal``. Each returns a JSON-able dict recorded on the history.
    """

    kind: ClassVar[str]
    params_model: ClassVar[type[FaultParams]]
    #: Capabilities (chaos/stack/capabilities.py) every fault of this kind needs; "a|b" = either.
    needs: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def capability_needs(cls, params: FaultParams) -> set[str]:
        """What this fault, with these settings, needs from the stack (default: ``needs``)."""
        return set(cls.needs)

    @classmethod
    def default_trigger(cls, params: FaultParams) -> DefaultTrigger:
        """The window this fault reaches when the scenario declares no ``trigger``: by default,
        the fault's own evidence. Kinds whose evidence does not show the system under test met
        the fault (a toxic on a link only heartbeats crossed) override this."""
        return DefaultTrigger("evidence", f"the {cls.kind} fault's own evidence (it counts what the system "
                              "under test did)")

    @classmethod
    def default_trigger_beside(cls, params: FaultParams, beside: Sequence[FaultParams] = ()) -> DefaultTrigger:
        """The default trigger of a fault that shares its phase with the faults ``beside`` (their
        params, this fault's own left out). A kind whose window depends on what else the phase
        does overrides this (``cancel`` beside a fault that holds LMCache's answers aims at the
        requests' LMCache calls); the default is :meth:`default_trigger`."""
        return cls.default_trigger(params)

    @classmethod
    def holds_lmcache_answers(cls, params: FaultParams) -> bool:
        """Whether this fault, while in place, keeps the engine waiting on LMCache (a slowed,
        stalled or cut link, a frozen LMCache or L2 service): a request's lookup or load is then
        in flight for longer than usual. Default False; the link kinds and ``pause`` say True."""
        return False

    def __init__(self, params: FaultParams) -> None:
        if not isinstance(params, self.params_model):
            raise TypeError(
                f"{type(self).__name__} needs {self.params_model.__name__}, "
                f"got {type(params).__name__}"
            )
        self.params = params

    @property
    def id(self) -> str:
        """The fault id used in the history (``fault_id``) and the report."""
        return self.params.id

    @abstractmethod
    def apply(self, ctx: FaultContext) -> dict[str, Any]:
        """Put the fault in place. Returns what was done (e.g. the toxic as the proxy sees it).

        Raises whatever the layer it touches raises; the runner records it as a ``fail``.
        """

    @abstractmethod
    def heal(self, ctx: FaultContext) -> dict[str, Any]:
        """Remove the fault. Must be safe to call when ``apply`` did not (fully) happen."""

    @abstractmethod
    def evidence(self, ctx: FaultContext) -> dict[str, Any]:
        """Whether the fault bit: ``{"bit": bool, ...counters}``. A fault that never bit makes
        the run inconclusive (the `evidence` check)."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.params!r})"
