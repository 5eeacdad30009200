"""Sweeps: many independent simulations (cells) run on local processes or a Ray cluster, merged in
a fixed order, each stored under a key of everything that determines it so a rerun resumes."""

from coda.sweep.executor import Cell, SweepFailed, SweepOptions, run_cells
from coda.sweep.store import CellStore, cell_key, file_digest, profile_digest, workload_identity

__all__ = ["Cell", "CellStore", "SweepFailed", "SweepOptions", "cell_key", "file_digest", "profile_digest", "run_cells",
           "workload_identity"]
