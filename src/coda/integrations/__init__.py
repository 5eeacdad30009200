"""Shells that run Coda inside other systems."""
