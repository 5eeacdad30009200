"""Coda inside vLLM: the scheduler class and the KV-event wire format."""
