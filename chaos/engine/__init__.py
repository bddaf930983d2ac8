"""kvchaos reference engine: a small, real CPU inference engine shaped like vLLM.

::

    HTTP (api.py, FastAPI) ──submit/abort──> EngineCore (scheduler.py, one thread)
        ^                                        │ each step: aborts → hooks → admit waiting
        └──── per-request event queues <─────────┤   (lookup → allocate → load) → run one
                                                 │   prefill segment or one decode token
                                                 │   per running request → store → finish
                         BlockManager (block_manager.py) ── KVPool (kv_pool.py, vLLM layout)
                         LMCacheConnector (connector.py) ── LMCache MP adapters ── lmcache server
                         PagedLlama (model.py)

Importing this package sets the no-telemetry environment (see ``environment.py``) before
anything imports lmcache.
"""

from chaos.engine.environment import apply_lmcache_environment

apply_lmcache_environment()
