"""Resolve a workload argument: a spec string (``synth:rate=3,duration=600,seed=0``) or a file."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from coda.errors import CodaError
from coda.workload.azure import looks_like_azure, read_azure
from coda.workload.mooncake import looks_like_mooncake, read_mooncake
from coda.workload.requests import looks_like_requests, read_requests
from coda.workload.schema import Workload, read_workload
from coda.workload.synth import SynthSpec, synthesize
from coda.workload.tracelab import looks_like_tracelab, read_tracelab

# Readers by format name; loaders of other trace formats register here.
READERS: dict[str, Callable[[Path], Workload]] = {
    "coda": read_workload,
    "tracelab": read_tracelab,
    "mooncake": read_mooncake,
    "azure": read_azure,
    "requests": read_requests,
}
# Format detectors: each looks at a file's first line and says whether it is its format.
DETECTORS: list[tuple[str, Callable[[Path, str], bool]]] = [
    ("coda", lambda path, first: '"session_id"' in first and '"rounds"' in first or '"coda_workload"' in first),
    ("tracelab", looks_like_tracelab),
    ("mooncake", looks_like_mooncake),
    ("azure", looks_like_azure),
    ("requests", looks_like_requests),
]


def parse_kv(spec: str, body: str, kinds: dict[str, type]) -> dict[str, object]:
    """Parse ``k=v,k=v`` with typed values; unknown keys and bad values name the fix."""
    out: dict[str, object] = {}
    for part in filter(None, (p.strip() for p in body.split(","))):
        if "=" not in part:
            raise CodaError(f"workload spec {spec!r}: {part!r} is not key=value; e.g. synth:rate=3,duration=600,seed=0")
        key, value = (x.strip() for x in part.split("=", 1))
        if key not in kinds:
            raise CodaError(f"workload spec {spec!r}: unknown key {key!r}; valid keys: {', '.join(kinds)}")
        try:
            out[key] = kinds[key](value)
        except ValueError:
            raise CodaError(f"workload spec {spec!r}: {key}={value!r} is not a valid {kinds[key].__name__}") from None
    return out


def synth_from_spec(spec: str) -> Workload:
    body = spec.split(":", 1)[1] if ":" in spec else ""
    kwargs = parse_kv(spec, body, {"rate": float, "duration": float, "seed": int, "tokens": float, "tools": float, "shape": str})
    missing = [k for k in ("rate", "duration") if k not in kwargs]
    if missing:
        raise CodaError(f"workload spec {spec!r}: missing {', '.join(missing)}; e.g. synth:rate=3,duration=600,seed=0")
    try:
        return synthesize(SynthSpec(**kwargs))  # type: ignore[arg-type]
    except ValueError as err:
        raise CodaError(f"workload spec {spec!r}: {err}") from None


def detect_format(path: Path) -> str:
    from coda.workload.schema import open_text

    if not path.exists():
        raise CodaError(f"{path}: no such workload file; pass a path or a spec such as synth:rate=3,duration=600,seed=0")
    with open_text(path) as fh:
        first = next((line for line in fh if line.strip()), "")
    for name, matches in DETECTORS:
        if matches(path, first):
            return name
    raise CodaError(f"{path}: cannot tell the workload format from its first line; pass --format ({', '.join(READERS)})")


def load_workload(arg: str, fmt: str | None = None) -> Workload:
    """Load a workload from a spec string or a file (format given or detected)."""
    if fmt is not None and fmt not in READERS:
        raise CodaError(f"unknown workload format {fmt!r}; valid: {', '.join(READERS)}")
    if not arg:
        raise CodaError("the workload argument is empty; pass a workload file or a spec such as synth:rate=3,duration=600,seed=0")
    if arg.startswith("synth:") or arg == "synth":
        return synth_from_spec(arg)
    path = Path(arg)
    name = fmt or detect_format(path)
    wl = READERS[name](path)
    wl.validate_sizes(str(path))
    return wl
