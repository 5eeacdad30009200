"""Workloads: session/round schema, synthetic generator, loaders, subsampling, statistics."""
