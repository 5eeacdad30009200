"""Replaying agent sessions against a real vLLM-CPU engine and in ``coda sim`` with the engine's
settings: the harness of the measured-profile test and of ``benchmarks/fidelity.py``.

The engine is a tiny random Llama (block 32, 250 KV blocks, 8 seats, a 4,096-token budget); its
tokenizer is rebuilt so that Coda's words and chat markers are one token each, so that
``coda bench --tokenizer`` sizes prompts exactly as the workload says.

The engine process (vLLM's EngineCore, which spins while it waits for its worker) is pinned to
the worker's core and the API server to the other cores (``pin``); on a machine with few cores
the spinner would otherwise starve the API server, and tokens would reach clients late and in
bursts.

The simulator models the engine, its API server included: what a client waits beyond the
engine's steps (HTTP, the server's tokenization of the prompt, the first chunk out) is the
profile's measured ``api_latency_s + api_text_token_s x prompt tokens``, which the simulator
charges before a request reaches the scheduler.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import yaml

BLOCK, BLOCKS, SEATS, BUDGET, MAX_LEN = 32, 250, 8, 4096, 6144
KV_BYTES_PER_TOKEN = 2 * 2 * 4 * 64 * 2  # K and V x 2 layers x 4 KV heads x head dim 64 x bf16
ENGINE_ARGS = ("--enable-prompt-tokens-details", "--block-size", str(BLOCK), "--num-gpu-blocks-override", str(BLOCKS),
               "--max-model-len", str(MAX_LEN), "--max-num-seqs", str(SEATS), "--max-num-batched-tokens", str(BUDGET))
SCHEDULER = "coda.integrations.vllm.scheduler.CodaScheduler"
MARKERS = ["<|system|>", "<|user|>", "<|assistant|>", "<|tool|>", "<|end|>"]


def word_tokenizer(model: Path) -> Path:
    """Give the tiny model a tokenizer in which Coda's words and chat markers are one token each
    (the test model's own tokenizer knows too few words). Same 1,000 ids, no byte tokens: every id
    decodes to text."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

    from coda.protocol.tokenizer import VOCAB

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=1000 - len(MARKERS), special_tokens=["<unk>", "<s>", "</s>"])
    tok.train_from_iterator([" ".join(VOCAB[:: len(VOCAB) // 1500][:1500].tolist())] * 20, trainer)
    tok.add_tokens([AddedToken(m, lstrip=True, normalized=False) for m in MARKERS])
    if tok.get_vocab_size() != 1000:
        raise RuntimeError(f"the word tokenizer has {tok.get_vocab_size()} ids, the tiny model 1000")
    tok.save(str(model / "tokenizer.json"))
    return model


def pin(url: str) -> None:
    """EngineCore onto the worker's core (0), the API server onto the others (see the module docstring)."""
    port = url.rsplit(":", 1)[1]
    procs = {int(p.name): p for p in Path("/proc").iterdir() if p.name.isdigit()}

    def cmd(p: Path) -> list[str]:
        try:
            return (p / "cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            return []

    api = next(pid for pid, p in procs.items() if "--port" in cmd(p) and port in cmd(p) and "--served-model-name" in cmd(p))
    others = set(range(1, os.cpu_count() or 2)) or {0}
    for pid, p in procs.items():
        try:
            comm, ppid = (p / "comm").read_text().strip(), int((p / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        cpus = others if pid == api else {0} if ppid == api and comm.startswith("VLLM::EngineCor") else None
        if cpus is not None:
            for tid in (p / "task").iterdir():
                os.sched_setaffinity(int(tid.name), cpus)


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
