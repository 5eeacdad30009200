"""Pure policies: snapshots in, decisions out. The simulator, the gateway and the vLLM plugin
call the same objects."""
