"""The step and host costs of one vLLM-CPU engine started with the agent burst's settings, placed
one of three ways: ``burst`` (the default) as the burst places an engine on an idle machine, its
forward pass's OpenMP thread on core 0 and its API server and EngineCore where the OS puts them;
``one-core`` with the whole engine on core 0, so that its host work and its forward pass wait for
each other, as they do once every core of the machine is taken; ``pair`` as the burst places its
two engines (the second one's forward pass on core 1), the second probed through the same grid over
and over while the first is measured, so every step timed is taken while both engines serve
(``benchmarks/vllm_cpu_contention.py`` pairs ``burst`` with either contended placement).
Measured on a reduced grid of ``coda profile measure --endpoint --host-probes`` (the same prober
and fit: 9 prefill, 8 decode and 3 text shapes, host probes over batches of 1 and 3, one repeat
unless ``--repeats`` says more), written as a measured profile with its samples beside it. The
engines are stopped on exit.

    CODA_VLLM_PYTHON=.venv-vllm/bin/python python benchmarks/vllm_cpu_host_measure.py OUT.json \\
        [--placement burst|one-core|pair] [--repeats N]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import datetime
import json
import tempfile
from pathlib import Path

from coda.bench.burst import EngineSettings
from coda.cost.profile import Profile
from coda.engines.vllm_cpu import KV_BYTES_PER_TOKEN, build_tiny_model, pin, vllm_servers, word_tokenizer
from coda.machine import machine
from coda.profiling.api_measure import PROBE_WORDS, Plan, Prober
from coda.profiling.empirical_fit import fit_step_model, measured_profile, write_host_samples, write_samples

PLAN = Plan(
    prefill=((16, 0), (128, 0), (512, 0), (1024, 0), (2048, 0), (3072, 0), (64, 1024), (64, 2048), (512, 1024)),
    decode=((1, 64), (1, 1024), (1, 2048), (2, 512), (4, 512), (4, 1024), (8, 256), (8, 384)),
    text=(64, 256, 512),
    output_tokens=32,
    repeats=1,
    host=((1, 32), (3, 32)),
    host_words=PROBE_WORDS,
)


PLACEMENTS = ("burst", "one-core", "pair")


def main(out: Path, placement: str, repeats: int = 1) -> None:
    args = EngineSettings().vllm_args()
    where = {"one-core": "API server and EngineCore pinned to core 0 with the forward pass",
             "burst": "API server and EngineCore unpinned, as the burst runs them",
             "pair": "API server and EngineCore unpinned, beside a second engine (forward pass on core 1) probed through the same grid "
                     "throughout, as the burst runs its two engines"}[placement]
    note = (f"vLLM-CPU flags: {' '.join(args)}; env VLLM_CPU_KVCACHE_SPACE=1 VLLM_CPU_OMP_THREADS_BIND=0 (the agent burst's engine 0); "
            f"{where}; a reduced grid (benchmarks/vllm_cpu_host_measure.py --placement {placement} --repeats {repeats})")

    async def measure(url: str, log: bool = True) -> tuple:
        prober = Prober(url, seed=0, log=(lambda m: print(m, flush=True)) if log else (lambda m: None))
        try:
            return (await prober.inspect(), *await prober.measure(dataclasses.replace(PLAN, repeats=repeats)))
        finally:
            await prober.close()

    async def beside(urls: list[str]) -> tuple:
        """The first engine measured while the second serves the same grid, over and over."""

        async def load() -> None:
            while True:
                await measure(urls[1], log=False)

        side = asyncio.ensure_future(load())
        try:
            return await measure(urls[0])
        finally:
            side.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await side

    engines = 2 if placement == "pair" else 1
    with tempfile.TemporaryDirectory(prefix="host-measure-") as d:
        model = word_tokenizer(build_tiny_model(Path(d) / "model"))
        logs = [out.with_suffix(f".engine{i}.log" if i else ".engine.log") for i in range(engines)]
        envs = [{"VLLM_CPU_OMP_THREADS_BIND": str(i)} for i in range(engines)]
        with vllm_servers(model, [args] * engines, envs=envs, logs=logs) as urls:
            if placement == "one-core":
                pin(urls[0], api_cpus={0})
            info, prefill, decode, api, host = asyncio.run(beside(urls) if placement == "pair" else measure(urls[0]))
    fit = fit_step_model(prefill, decode)
    samples = out.with_name(out.stem + ".samples.csv")
    write_samples(samples, prefill, decode, api)
    write_host_samples(out.with_name(out.stem + ".host.csv"), host)
    kv = (KV_BYTES_PER_TOKEN, "given: the tiny model's (coda.engines.vllm_cpu.KV_BYTES_PER_TOKEN)")
    data = measured_profile(out.stem, info, prefill, decode, fit, api, host, kv_bytes_per_token=kv, samples=samples.name,
                            date=datetime.date.today().isoformat(), machine=machine(vllm=info.version), note=note)
    Profile.model_validate(data)
    out.write_text(json.dumps(data, indent=2) + "\n")
    print(json.dumps(data["step_model"], indent=1))


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", type=Path, help="the measured profile to write (its samples beside it)")
    ap.add_argument("--placement", choices=PLACEMENTS, default="burst")
    ap.add_argument("--repeats", type=int, default=1, help="times each shape is timed (a contended placement's steps vary more)")
    a = ap.parse_args()
    if a.repeats < 1:
        ap.error("--repeats must be at least 1")
    main(a.out, a.placement, a.repeats)
