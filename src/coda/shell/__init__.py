"""What the three shells (the simulator, the gateway, the vLLM plugin) share around the pure policy
core: running policies in shadow, session slots, estimates, the KV indexer and the JSON writer."""
