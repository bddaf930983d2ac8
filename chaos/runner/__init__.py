"""The runner: one scenario run on a stack, a suite of runs, the stack pool."""
