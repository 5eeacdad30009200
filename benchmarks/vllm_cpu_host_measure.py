"""The step and host costs of one vLLM-CPU engine started with the agent burst's settings and
placement (its OMP thread bound to core 0, its API server and EngineCore where the OS puts them),
on a reduced grid of ``coda profile measure --endpoint --host-probes`` (the same prober and fit:
9 prefill, 8 decode and 3 text shapes, host probes over batches of 1 and 3, one repeat), written
as a measured profile with its samples beside it. The engine is stopped on exit.

    CODA_VLLM_PYTHON=.venv-vllm/bin/python python benchmarks/vllm_cpu_host_measure.py runs/host-measure/vllm-cpu-burst-host.json
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
from coda.engines.vllm_cpu import KV_BYTES_PER_TOKEN, build_tiny_model, vllm_servers, word_tokenizer
from coda.profiling.api_measure import PROBE_WORDS, Plan, Prober
from coda.profiling.empirical_fit import fit_step_model, measured_profile, write_host_samples, write_samples
from coda.profiling.machine import machine

PLAN = Plan(
    prefill=((16, 0), (128, 0), (512, 0), (1024, 0), (2048, 0), (3072, 0), (64, 1024), (64, 2048), (512, 1024)),
    decode=((1, 64), (1, 1024), (1, 2048), (2, 512), (4, 512), (4, 1024), (8, 256), (8, 384)),
    text=(64, 256, 512),
    output_tokens=32,
    repeats=1,
    host=((1, 32), (3, 32)),
    host_words=PROBE_WORDS,
)


def main(out: Path) -> None:
    eng = EngineSettings()
    args = ["--block-size", str(eng.block_tokens), "--num-gpu-blocks-override", str(eng.kv_blocks), "--max-model-len",
            str(eng.max_model_len), "--max-num-seqs", str(eng.max_num_seqs), "--max-num-batched-tokens", str(eng.max_num_batched_tokens),
            "--enable-prefix-caching", "--enable-prompt-tokens-details"]
    note = (f"vLLM-CPU flags: {' '.join(args)}; env VLLM_CPU_KVCACHE_SPACE=1 VLLM_CPU_OMP_THREADS_BIND=0 (the agent burst's engine 0); "
            "API server and EngineCore unpinned, as the burst runs them; a reduced grid (benchmarks/vllm_cpu_host_measure.py)")

    async def measure(url: str) -> tuple:
        prober = Prober(url, seed=0, log=lambda m: print(m, flush=True))
        try:
            return (await prober.inspect(), *await prober.measure(PLAN))
        finally:
            await prober.close()

    with tempfile.TemporaryDirectory(prefix="host-measure-") as d:
        model = word_tokenizer(build_tiny_model(Path(d) / "model"))
        with vllm_servers(model, [args], envs=[{"VLLM_CPU_OMP_THREADS_BIND": "0"}], logs=[out.with_suffix(".engine.log")]) as urls:
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
    main(Path(sys.argv[1]))
