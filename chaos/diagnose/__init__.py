"""chaos/diagnose: why a request failed, in the false-hit triage's terms.

    failing run (history + snapshots + checks) + the running stack
        └─> per failing request: A/B replay │ first divergence │ length vs lookup │
            KV diff per chunk and layer (served LMCache objects vs a witness LMCache the
            recompute twin writes) │ key identity ─> verdict + evidence ─> diagnosis.json

It reads LMCache with LMCache's own client, hasher and key formats and never imports the
reference engine, so it works for any engine that stores through LMCache. Entry points:
:func:`chaos.diagnose.diagnose.diagnose_failures` (a live stack), ``kvchaos diagnose RUN_DIR``
(chaos/diagnose/cli.py), and :func:`chaos.diagnose.hook.diagnose_after_checks` (``kvchaos run``).
"""
