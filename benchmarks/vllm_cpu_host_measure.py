"""The step and host costs of one vLLM-CPU engine started with the agent burst's settings, placed
one of two ways: ``burst`` (the default) as the burst places an engine, its forward pass's OpenMP
thread on core 0 and its API server and EngineCore where the OS puts them; ``one-core`` with the
whole engine on core 0, so that its host work and its forward pass wait for each other, as they do
once every core of the machine is taken (``benchmarks/vllm_cpu_contention.py`` pairs the two).
Measured on a reduced grid of ``coda profile measure --endpoint --host-probes`` (the same prober and fit:
9 prefill, 8 decode and 3 text shapes, host probes over batches of 1 and 3, one repeat), written
as a measured profile with its samples beside it. The engine is stopped on exit.

    CODA_VLLM_PYTHON=.venv-vllm/bin/python python benchmarks/vllm_cpu_host_measure.py OUT.json [--placement burst|one-core]
"""

from __future__ import annotations

import asyncio
import datetime
import json
import sys
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


PLACEMENTS = ("burst", "one-core")


def main(out: Path, placement: str) -> None:
    args = EngineSettings().vllm_args()
    where = ("API server and EngineCore pinned to core 0 with the forward pass" if placement == "one-core" else
             "API server and EngineCore unpinned, as the burst runs them")
    note = (f"vLLM-CPU flags: {' '.join(args)}; env VLLM_CPU_KVCACHE_SPACE=1 VLLM_CPU_OMP_THREADS_BIND=0 (the agent burst's engine 0); "
            f"{where}; a reduced grid (benchmarks/vllm_cpu_host_measure.py --placement {placement})")

    async def measure(url: str) -> tuple:
        prober = Prober(url, seed=0, log=lambda m: print(m, flush=True))
        try:
            return (await prober.inspect(), *await prober.measure(PLAN))
        finally:
            await prober.close()

    with tempfile.TemporaryDirectory(prefix="host-measure-") as d:
        model = word_tokenizer(build_tiny_model(Path(d) / "model"))
        with vllm_servers(model, [args], envs=[{"VLLM_CPU_OMP_THREADS_BIND": "0"}], logs=[out.with_suffix(".engine.log")]) as urls:
            if placement == "one-core":
                pin(urls[0], api_cpus={0})
            info, prefill, decode, api, host = asyncio.run(measure(urls[0]))
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
    given = sys.argv[1:]
    chosen = given[given.index("--placement") + 1] if "--placement" in given[:-1] else "burst"
    if len(given) not in (1, 3) or chosen not in PLACEMENTS:
        raise SystemExit(f"usage: python benchmarks/vllm_cpu_host_measure.py OUT.json [--placement {'|'.join(PLACEMENTS)}]")
    main(Path(given[0]), chosen)
