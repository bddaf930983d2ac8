# kvchaos: every target does its own set-up (scripts/setup.sh and scripts/build-image.sh are
# idempotent).
VENV ?= .venv
PY := $(VENV)/bin/python
KVCHAOS := $(VENV)/bin/kvchaos
# The default suite of `make demo`: no fault, a lookup stall, a node exit.
SUITE ?= scenarios/smoke.yaml scenarios/lookup-timeout.yaml scenarios/node-exit-lmcache.yaml

.PHONY: setup image demo test test-fast zoo zoo-tolerant bench clean

setup:
	bash scripts/setup.sh

## The Docker image of the reference stack for --backend compose (Docker engine, offline base).
image: setup
	bash scripts/build-image.sh

## The main job: the default chaos scenario suite against the reference stack (local processes).
demo: setup
	$(KVCHAOS) run $(SUITE)

## Every test: unit and integration (real LMCache, Redis, proxy, Docker), then the scenarios.
test: setup image
	$(PY) -m pytest -q -p no:cacheprovider -m "not chaos" tests
	$(PY) -m pytest -q -p no:cacheprovider -m chaos --junitxml=reports/junit-chaos.xml

## Unit tests only (no real servers, no Docker).
test-fast: setup
	$(PY) -m pytest -q -p no:cacheprovider -m "not slow and not chaos" tests

## The bug zoo: the catalogue against the clean engine and each planted bug (reports/zoo/).
zoo: setup
	$(KVCHAOS) zoo $(ZOO_ARGS)

## Verdicts that survive engines that are not bit-exact: the zoo with the reference engine's
## batch-dependent numerics and recompute_equivalence in tolerant mode, three times (the clean
## catalogue must pass every time, every planted bug must still be caught), then the clean
## catalogue in exact mode on the same numerics, which must fail (the mode is needed).
## Rates per cell (noise floor, hit-path divergence) in reports/zoo-tolerant/matrix.md.
ZOO_TOLERANT_ARGS ?= --repeat 3
zoo-tolerant: setup
	$(KVCHAOS) zoo --numerics batch-dependent --equivalence tolerant --out reports/zoo-tolerant $(ZOO_TOLERANT_ARGS)
	$(KVCHAOS) run scenarios/ --numerics batch-dependent --report-dir reports/zoo-tolerant/exact-mode; \
	  rc=$$?; if [ $$rc -ne 1 ]; then echo "exact mode on batch-dependent numerics exited $$rc, expected 1 (a check failed)"; exit 1; fi; \
	  echo "exact mode on batch-dependent numerics failed, as it must: the tolerant mode is needed"

bench: setup
	$(PY) benchmarks/proxy_throughput.py
	$(PY) benchmarks/ttft_hit.py
	$(PY) benchmarks/suite_overhead.py

clean:
	rm -rf $(VENV) reports/*/ .pytest_cache
