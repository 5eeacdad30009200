"""The evaluation code: the paper-shaped presets, their reference numbers and SLO fitting, and the
experiments behind docs/evaluation.md. It runs on the installed package and is not part of it
(nothing under src/ imports it). Run a script from the repository root: ``python -m experiments.NAME``."""
