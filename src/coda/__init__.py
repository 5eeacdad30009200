"""Coda: admission and routing for serving LLM coding agents on self-hosted engines.

The Python API is ``coda.simulate`` and ``coda.compare`` (with ``coda.SimConfig``, see
``coda.api``). They load on first use, so ``import coda`` stays as light as vLLM's scheduler
plugin needs it to be.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"
__all__ = ["SimConfig", "Workload", "__version__", "compare", "load_workload", "simulate"]

_LAZY = {
    "simulate": "coda.api",
    "compare": "coda.api",
    "SimConfig": "coda.sim.config",
    "Workload": "coda.workload.schema",
    "load_workload": "coda.workload.spec",
}

if TYPE_CHECKING:
    from coda.api import compare, simulate
    from coda.sim.config import SimConfig
    from coda.workload.schema import Workload
    from coda.workload.spec import load_workload


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'coda' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
