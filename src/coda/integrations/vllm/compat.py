"""The vLLM versions whose scheduler API ``CodaScheduler`` is tested against.

The scheduler subclasses vLLM's ``Scheduler`` and replaces its waiting queue, an interface vLLM
does not declare public (it warns so for every custom scheduler class) and changes between minor
releases. An untested version therefore fails at startup, in one line naming the tested range,
instead of misbehaving later. Patch releases, local builds (``+cpu``) and development builds
inside the range are accepted.
"""

from __future__ import annotations

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

from coda.errors import CodaError

RANGE = ">=0.32.0,<0.33"  # tested: 0.32.x
SUPPORTED = SpecifierSet(RANGE)


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
