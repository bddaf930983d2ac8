"""Fault kinds (one module each), their registry and the context they run in."""
