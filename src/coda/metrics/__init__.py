"""Serving metrics with one definition for the simulator and the benchmark harness: per request
(``requests``) and per task, an agent's whole session (``tasks``)."""
