"""Stacks: the stack file model, the local and compose backends, ports and probes."""
