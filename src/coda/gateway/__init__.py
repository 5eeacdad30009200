"""``coda serve``: an OpenAI-compatible gateway that admits and routes requests to N engines with
the same policy code the simulator evaluates (see docs/gateway.md)."""
