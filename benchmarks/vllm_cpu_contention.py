"""The contended regime of vLLM-CPU engines that share a machine's cores, measured, and written into
a profile's ``step_model.host.contended`` section (``coda.cost.profile.ContendedSteps``).

Two profiles of the same engine, measured with ``benchmarks/vllm_cpu_host_measure.py`` on the
same grid: one placed as the agent burst places an engine on an idle machine (``--placement
burst``: its forward pass on core 0, its API server free to use the other core) and one contended,
either with the whole engine squeezed onto one core (``--placement one-core``), where its API
server, its EngineCore and its forward pass wait for each other as they do once every core is
taken, or measured while a second engine placed as the burst places it serves the same grid
(``--placement pair``: the regime itself, both engines serving on the machine's two cores). The
contended step is fitted as ``base_s + scale x`` the uncontended one over their paired shapes
(least squares), and the cores one engine keeps busy while it serves alone (its CPU over wall
time) are measured here, by sending requests of the burst's kinds one at a time to a fresh engine
and reading its processes' CPU from /proc. Nothing is fitted on the burst itself.

    CODA_VLLM_PYTHON=.venv-vllm/bin/python python benchmarks/vllm_cpu_contention.py \\
        BURST.json CONTENDED.json OUT.json
"""

from __future__ import annotations

import csv
import json
import os
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np

from coda.bench.burst import EngineSettings
from coda.bench.doors import group_cpu_s
from coda.cost.profile import Profile
from coda.engines.vllm_cpu import build_tiny_model, vllm_servers, word_tokenizer

#: request shapes of the CPU probe: (prompt words, output tokens, a shared cached prefix): the
#: burst's short turns, its long re-sent contexts and a cold long prompt
SHAPES = ((32, 1, False), (32, 10, False), (800, 10, True), (800, 1, True), (32, 50, False), (800, 10, False))
#: requests per shape, one at a time
PER_SHAPE = 30


def samples(profile: Path) -> list[float]:
    """The seconds of every shape a measured profile timed (the median of its repeats), in the samples file's order."""
    shapes: dict[tuple[str, ...], list[float]] = {}
    with profile.with_name(profile.stem + ".samples.csv").open() as fh:
        for row in csv.DictReader(fh):
            if row["kind"] in ("prefill", "decode"):
                shape = tuple(v for k, v in row.items() if k not in ("repeat", "seconds"))
                shapes.setdefault(shape, []).append(float(row["seconds"]))
    return [statistics.median(times) for times in shapes.values()]


def fit_contended(burst: Path, contended: Path) -> tuple[float, float, float]:
    """base_s, scale and the median relative error of ``contended = base_s + scale x burst`` over the paired shapes."""
    x, y = np.array(samples(burst)), np.array(samples(contended))
    if len(x) != len(y) or len(x) < 3:
        raise SystemExit(f"error: {burst} and {contended} must time the same shapes (got {len(x)} and {len(y)}); measure both on one grid")
    (base, scale), *_ = np.linalg.lstsq(np.vstack([np.ones_like(x), x]).T, y, rcond=None)
    base, scale = max(0.0, float(base)), max(1.0, float(scale))
    return base, scale, float(np.median(np.abs((base + scale * x) / y - 1)))


def engine_cores() -> tuple[float, list[dict[str, float]]]:
    """The median over ``SHAPES`` of one engine's CPU seconds per wall second while it serves one request at a time."""
    args = EngineSettings().vllm_args()
    words = [f"w{i % 500}" for i in range(2000)]  # words of the tiny model's word tokenizer, each one token
    rows = []
    with tempfile.TemporaryDirectory(prefix="contention-") as d:
        model = word_tokenizer(build_tiny_model(Path(d) / "model"))
        procs: list = []
        with vllm_servers(model, [args], envs=[{"VLLM_CPU_OMP_THREADS_BIND": "0"}], procs=procs, quick=False) as urls, \
                httpx.Client(timeout=120) as client:
            for _ in range(5):  # warm-up
                send(client, urls[0], " ".join(words[:16]), 4)
            for n, out, cached in SHAPES:
                cpu0, t0 = group_cpu_s(procs[0].pid), time.perf_counter()
                for i in range(PER_SHAPE):
                    text = " ".join(words[:n]) if cached else " ".join(words[(i * 7 + j * 13) % len(words)] for j in range(n))
                    send(client, urls[0], text, out)
                cpu, wall = group_cpu_s(procs[0].pid) - cpu0, time.perf_counter() - t0
                rows.append({"words": n, "output": out, "cached": cached, "cpu_ms": 1000 * cpu / PER_SHAPE,
                             "wall_ms": 1000 * wall / PER_SHAPE, "cores": cpu / wall})
                print(json.dumps(rows[-1]), flush=True)
    return statistics.median(r["cores"] for r in rows), rows


def send(client: httpx.Client, url: str, text: str, out: int) -> None:
    """One streamed chat completion of ``out`` tokens, read to its end."""
    body = {"model": "tiny", "messages": [{"role": "user", "content": text}], "max_tokens": out, "min_tokens": out, "temperature": 0,
            "stream": True, "stream_options": {"include_usage": True}}
    with client.stream("POST", url + "/v1/chat/completions", json=body) as r:
        r.raise_for_status()
        for _ in r.iter_lines():
            pass


def placement(profile: Path) -> str:
    """The ``--placement`` a profile of ``vllm_cpu_host_measure.py`` was measured with (its note says)."""
    m = re.search(r"--placement ([a-z-]+)", profile.read_text())
    return m.group(1) if m else "unknown"


def main(burst: Path, contended: Path, out: Path) -> None:
    base, scale, err = fit_contended(burst, contended)
    cores, rows = engine_cores()
    data = json.loads(burst.read_text())
    machine_cores = os.cpu_count() or 1
    data["step_model"]["host"]["contended"] = {"base_s": base, "scale": scale, "engine_cores": cores, "cores": machine_cores,
                                               "fit_median_err": err}
    how = (f"benchmarks/vllm_cpu_contention.py on {burst.name} ({placement(burst)} placement) and {contended.name} "
           f"({placement(contended)} placement)")
    data["provenance"].update({
        "step_model.host.contended.base_s": f"fitted: {how}, least squares over their {len(samples(burst))} paired shapes",
        "step_model.host.contended.scale": f"fitted: {how}, least squares over their paired shapes",
        "step_model.host.contended.engine_cores": f"measured: one engine's CPU over wall time serving one request at a time, median over "
                                                  f"{len(rows)} request shapes of {PER_SHAPE} requests ({how})",
        "step_model.host.contended.cores": "measured: the cores of the machine the engines were measured on (os.cpu_count)",
        "step_model.host.contended.fit_median_err": f"measured: the fit's median relative error over the paired shapes ({how})",
    })
    data["name"] = out.stem
    Profile.model_validate(data)
    out.write_text(json.dumps(data, indent=2) + "\n")
    print(json.dumps(data["step_model"]["host"], indent=1))


if __name__ == "__main__":
    if len(sys.argv) != 4:
        raise SystemExit("usage: python benchmarks/vllm_cpu_contention.py BURST.json CONTENDED.json OUT.json")
    main(*(Path(a) for a in sys.argv[1:]))
