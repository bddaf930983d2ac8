"""Fault kinds (one module each), their registry and the context they run in."""

#: Fault kinds whose window is what the requests of their own phase do some time after they are
#: sent: their L2 stores (disk_full) or their loads from a tier the fault emptied or broke
#: (tier_flush, l2_corrupt, l2_fault_inject). In a phase that sends requests such a fault lasts
#: ``until: end``: a fixed duration is outrun by a slow host's stores or loads (the catalogue's
#: rule, tests/catalogue/test_catalogue.py; the explore generator's, chaos/explore/generate.py).
STORE_OR_LOAD_WINDOWS = frozenset({"disk_full", "tier_flush", "l2_corrupt", "l2_fault_inject"})
