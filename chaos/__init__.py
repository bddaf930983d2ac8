"""kvchaos: fault-injection testing for KV-cache-reusing LLM serving stacks."""
__version__ = "0.1.0"
