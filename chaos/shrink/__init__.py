"""chaos/shrink: a failing run -> the smallest scenario that still fails the same check
(``kvchaos shrink RUN_DIR``; chaos/shrink/shrink.py has the algorithm, cli.py the runs)."""
