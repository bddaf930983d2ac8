"""hook: a stack-specific fault written as an HTTP call or a command, at apply and at heal.

    apply ── {http: {method, url, json, expect_status}} | {argv: [...]}   (no shell)
    heal  ── same shape (optional)
    evidence ── {http: {url, json_path, min_delta}}: a number in a JSON answer grew by at least
                min_delta between apply and heal; or {argv: [...]}: the command exits 0
                (both measured while the fault is in place, just before the heal call)

For faults one stack offers and kvchaos has no kind for, e.g. swapping LMCache's
``fault_inject`` L2 adapter in, or an engine's own ``/hooks/...`` route. Strings in ``url``,
``json`` and ``argv`` may use the stack's variables (``${ENGINE_PORT}``), expanded with the
running stack's values at apply time. Without an ``evidence`` spec the fault reports
``bit: false`` ("no evidence spec"): the run is inconclusive until the author says how to
prove the hook bit.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from pathlib import Path
from typing import Any, Literal

import httpx
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from chaos.faults.base import DefaultTrigger, Fault, FaultContext, FaultParams
from chaos.faults.registry import register
from chaos.probes import json_at, read_json_number
from chaos.stack.interpolate import interpolate, interpolate_data

__all__ = ["HttpCall", "HookStep", "HttpProbe", "HookEvidence", "HookParams", "Hook", "json_at"]


class HttpCall(BaseModel):
    """One HTTP request. (The body field is ``json`` in YAML; ``json_body`` in Python, since a
    field named ``json`` would shadow a BaseModel method.)"""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    method: Literal["GET", "POST", "PUT", "PATCH", "DELETE"] = Field(default="POST", description="HTTP method")
    url: str = Field(min_length=1, description="absolute URL; may use ${VARS} of the stack")
    json_body: Any = Field(default=None, alias="json", description="JSON body to send (optional)")
    expect_status: list[int] | int | None = Field(
        default=None, description="status code(s) that count as success; default any 2xx"
    )

    def ok(self, status: int) -> bool:
        """Whether ``status`` counts as success."""
        want = self.expect_status
        if want is None:
            return 200 <= status < 300
        return status in (want if isinstance(want, list) else [want])


class HookStep(BaseModel):
    """An action: exactly one of ``http`` or ``argv``."""

    model_config = ConfigDict(extra="forbid")
    http: HttpCall | None = Field(default=None, description="an HTTP request")
    argv: list[str] | None = Field(default=None, min_length=1,
                                   description="a command as an argument list (no shell); may use ${VARS}")
    timeout_s: float = Field(default=30.0, gt=0, description="seconds the call or command may take")

    @model_validator(mode="after")
    def _one(self) -> HookStep:
        if (self.http is None) == (self.argv is None):
            raise ValueError("give exactly one of `http` or `argv`")
        return self


class HttpProbe(BaseModel):
    """A number read from a JSON endpoint."""

    model_config = ConfigDict(extra="forbid")
    url: str = Field(min_length=1, description="URL answering JSON (GET); may use ${VARS}")
    json_path: str = Field(min_length=1, description="dotted path to a number in the answer (a.b.0.c)")
    min_delta: float = Field(default=1.0, description="the number must grow at least this much")


class HookEvidence(BaseModel):
    """How to prove the hook bit: exactly one of ``http`` or ``argv``."""

    model_config = ConfigDict(extra="forbid")
    http: HttpProbe | None = Field(default=None, description="a counter that must grow")
    argv: list[str] | None = Field(default=None, min_length=1, description="a command that exits 0 when it bit")
    timeout_s: float = Field(default=30.0, gt=0, description="seconds the probe may take")

    @model_validator(mode="after")
    def _one(self) -> HookEvidence:
        if (self.http is None) == (self.argv is None):
            raise ValueError("give exactly one of `http` or `argv`")
        return self


class HookParams(FaultParams):
    """An HTTP call or a command at apply (and optionally at heal), with an optional evidence probe."""

    kind: Literal["hook"]
    service: str = Field(min_length=1, description="the compose service the hook acts on")
    apply: HookStep = Field(description="what to do at apply")
    heal: HookStep | None = Field(default=None, description="what to do at heal (optional)")
    evidence: HookEvidence | None = Field(default=None, description="how to prove it bit (optional)")
    needs: list[str] = Field(
        default_factory=list,
        description="capabilities the hook's calls need from the stack (chaos/stack/capabilities.py), "
        "e.g. [engine.hooks.stall] for the reference engine's /hooks/stall; a stack that lacks one "
        "rejects the scenario before anything starts")

    @field_validator("needs")
    @classmethod
    def _known_needs(cls, v: list[str]) -> list[str]:
        from chaos.stack.capabilities import CAPABILITIES, is_known

        unknown = [n for need in v for n in need.split("|") if not is_known(n)]
        if unknown:
            raise ValueError(f"unknown capabilities {unknown}; known: {', '.join(sorted(CAPABILITIES))}")
        return v

    def stack_refs(self) -> dict[str, str]:
        return {"service": self.service}


def run_command(argv: list[str], timeout_s: float, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess:
    """Run a hook's command and wait for it, not for what it leaves running.

    Its output goes to temporary files, not pipes: a command that starts a background process
    (a squatter on a port, a load generator) would otherwise keep the pipes open, and the wait
    for their end would last the whole ``timeout_s`` and then fail although the command had
    ended at once.

    Returns:
        the finished process (``returncode``, ``stdout``, ``stderr`` as text).
    Raises:
        subprocess.TimeoutExpired: the command itself ran past ``timeout_s`` seconds (it is
            killed).
    """
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        r = subprocess.run(argv, stdout=out, stderr=err, timeout=timeout_s, env=env, cwd=cwd,
                           stdin=subprocess.DEVNULL)
        out.seek(0)
        err.seek(0)
        return subprocess.CompletedProcess(argv, r.returncode, out.read().decode(errors="replace"),
                                           err.read().decode(errors="replace"))


@register("hook")
class Hook(Fault):
    """Run ``apply`` at apply and ``heal`` at heal; evidence as the spec says."""

    params_model = HookParams
    params: HookParams

    @classmethod
    def default_trigger(cls, params: FaultParams) -> DefaultTrigger:
        """The hook's own evidence spec: kvchaos cannot tell more from a URL or a command."""
        return DefaultTrigger("evidence", "the hook's evidence spec was met (what the author said shows "
                              "it bit)")

    @classmethod
    def capability_needs(cls, params: FaultParams) -> set[str]:
        """What the scenario author listed under ``needs`` (kvchaos cannot tell from a URL)."""
        return set(getattr(params, "needs", []))

    def __init__(self, params: FaultParams) -> None:
        super().__init__(params)
        self._env: dict[str, str] = {}
        self._applied_ok = False
        self._before: float | None = None
        self._probe: dict[str, Any] | None = None

    # --- helpers -------------------------------------------------------------------------
    def _expand(self, value: Any) -> Any:
        return interpolate_data(value, self._env)

    def _run(self, step: HookStep, ctx: FaultContext, what: str) -> dict[str, Any]:
        if step.http is not None:
            call = step.http
            url = interpolate(call.url, self._env)
            body = self._expand(call.json_body)
            r = httpx.request(call.method, url, json=body, timeout=step.timeout_s)
            if not call.ok(r.status_code):
                raise RuntimeError(f"hook {what}: {call.method} {url} answered HTTP {r.status_code}: "
                                   f"{r.text[:300]}")
            return {"http": {"method": call.method, "url": url, "status": r.status_code, "body": r.text[:500]}}
        argv = [interpolate(a, self._env) for a in step.argv or []]
        env = {**os.environ, **self._env}
        r2 = run_command(argv, step.timeout_s, env, ctx.scenario_dir)
        if r2.returncode != 0:
            raise RuntimeError(f"hook {what}: {argv} exited {r2.returncode}: {(r2.stderr or r2.stdout)[-300:]}")
        return {"argv": argv, "returncode": 0, "stdout": r2.stdout[-500:]}

    def _read_number(self, probe: HttpProbe, timeout_s: float) -> float:
        return read_json_number(interpolate(probe.url, self._env), probe.json_path, timeout_s=timeout_s)

    def _measure(self, ctx: FaultContext) -> dict[str, Any]:
        ev = self.params.evidence
        assert ev is not None
        if ev.http is not None:
            after = self._read_number(ev.http, ev.timeout_s)
            delta = after - (self._before or 0.0)
            return {"bit": delta >= ev.http.min_delta, "before": self._before, "after": after, "delta": delta,
                    "min_delta": ev.http.min_delta}
        argv = [interpolate(a, self._env) for a in ev.argv or []]
        try:
            r = run_command(argv, ev.timeout_s, {**os.environ, **self._env}, ctx.scenario_dir)
        except subprocess.TimeoutExpired:
            return {"bit": False, "argv": argv, "reason": f"timed out after {ev.timeout_s:g}s"}
        return {"bit": r.returncode == 0, "argv": argv, "returncode": r.returncode,
                "output": (r.stdout + r.stderr)[-300:]}

    # --- fault ---------------------------------------------------------------------------
    def apply(self, ctx: FaultContext) -> dict[str, Any]:
        """Read the evidence counter (http evidence), then run the apply step.

        Raises:
            RuntimeError: the call answered an unexpected status or the command exited non-zero.
            httpx.HTTPError, subprocess.TimeoutExpired, OSError: the call could not be made.
            chaos.probes.ProbeError: the evidence counter could not be read as a number at
                ``json_path``.
        """
        self._env = dict(getattr(ctx.stack, "env", None) or {})
        ev = self.params.evidence
        if ev is not None and ev.http is not None:
            self._before = self._read_number(ev.http, ev.timeout_s)
        done = self._run(self.params.apply, ctx, "apply")
        self._applied_ok = True
        return {"service": self.params.service, **done}

    def heal(self, ctx: FaultContext) -> dict[str, Any]:
        """Measure the evidence (while the fault is still in place), then run the heal step."""
        if self.params.evidence is not None and self._applied_ok:
            try:
                self._probe = self._measure(ctx)
            except Exception as exc:  # evidence is best effort; heal must still run
                self._probe = {"bit": False, "reason": f"{type(exc).__name__}: {exc}"}
        if self.params.heal is None:
            return {"service": self.params.service, "heal": None}
        if not self._env:
            self._env = dict(getattr(ctx.stack, "env", None) or {})
        return {"service": self.params.service, **self._run(self.params.heal, ctx, "heal")}

    def evidence(self, ctx: FaultContext) -> dict[str, Any]:
        """What the evidence spec measured at heal; ``bit: false`` without a spec."""
        if self.params.evidence is None:
            return {"bit": False, "reason": "no evidence spec", "applied": self._applied_ok}
        if self._probe is None:
            return {"bit": False, "reason": "the apply step did not succeed" if not self._applied_ok
                    else "not measured"}
        return self._probe
