"""Engines Coda can drive for tests and laptops: the fake engine timed by the cost model."""
