"""The workload: seeded requests (prefix families, suffixes, conversations, tenants) and the
OpenAI-compatible client that sends them and records the history."""
