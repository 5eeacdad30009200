"""Discrete-event simulator of a cluster of engine workers (the default shell)."""
