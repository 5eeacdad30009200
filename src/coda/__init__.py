"""Coda: admission and routing for serving LLM coding agents on self-hosted engines."""

__version__ = "0.1.0"
