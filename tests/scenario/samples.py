"""Sample files for the scenario tests: a minimal stack and a valid scenario (line numbers
of GOOD are asserted in tests: edit with care)."""

STACK = """\
services:
  engine: {command: [sleep, "1"]}
  lmcache: {command: [sleep, "1"]}
  toxiproxy: {command: [sleep, "1"]}
x-kvchaos:
  proxy: {service: toxiproxy, api: "http://127.0.0.1:18474"}
  links:
    engine-lmcache: {listen: "127.0.0.1:15555", upstream: "127.0.0.1:5555"}
    lmcache-redis: {listen: "127.0.0.1:16379", upstream: "127.0.0.1:6379"}
  leak_sources:
    - {name: lmcache, url: "http://127.0.0.1:18080/status", fields: {active_sessions: active_sessions}}
  engine_url: "http://127.0.0.1:18100"
"""

GOOD = """\
name: lookup-stall
description: test
stack: stack.yml
seed: 7
workload:
  families: 2
  prefix_tokens: [255, 256]
  requests: 4
phases:
  - name: warm
  - name: stall
    faults:
      - kind: latency
        link: engine-lmcache
        latency_ms: 3000
        start: 500ms
        duration: 1m30s
checks:
  liveness: {request_deadline_s: 30}
  leaks:
"""
