"""The processes benchmarks put between a client and the engines: ``coda serve`` and the peer router
``vllm-router`` (a Rust router on PyPI, installed into a virtual environment of its own on first
use), with the CPU time of a process read from /proc and what `coda serve`'s /metrics says of its run."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from coda.engines.vllm_cpu import BLOCK
from coda.serving.procs import free_port, running

PEER = "vllm-router"
PEER_VERSION = "0.1.17"
CLK_TCK = os.sysconf("SC_CLK_TCK")
LOOP_LAG = "coda_gateway_event_loop_lag_seconds"
#: vllm-router's --queue-size default, and a queue timeout equal to the gateway's default defer wait
PEER_QUEUE, PEER_QUEUE_TIMEOUT_S = 100, 5


@dataclass
class Proxy:
    """A process between the client and the engines (None for direct)."""

    url: str
    pid: int



def _stat(proc: Path) -> list[str]:
    """The fields of ``/proc/PID/stat`` after the command name (state, parent, group, ...)."""
    return (proc / "stat").read_text().rsplit(")", 1)[1].split()


def _cpu(fields: list[str]) -> float:
    return (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime + stime


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process, all its threads."""
    return _cpu(_stat(Path(f"/proc/{pid}")))


def group_cpu_s(pgid: int) -> float:
    """User + system CPU seconds of the live processes of a process group (a vLLM server: its API
    server and engine core); a process that exits between reads is left out."""
    total = 0.0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = _stat(entry)
        except OSError:
            continue
        if int(fields[2]) == pgid:
            total += _cpu(fields)
    return total



def peer_python(version: str, venv: Path) -> Path:
    """vllm-router ``version`` in a virtual environment of its own (created on first use)."""
    exe = venv / "bin" / "python"
    probe = [str(exe), "-c", "import importlib.metadata as m; print(m.version('vllm-router'))"]
    if exe.exists() and subprocess.run(probe, capture_output=True, text=True).stdout.strip() == version:
        return exe
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    subprocess.run([str(exe), "-m", "pip", "install", "-q", f"vllm-router=={version}"], check=True)
    return exe


def peer_limit(seats: int, queue: int = PEER_QUEUE, timeout_s: int = PEER_QUEUE_TIMEOUT_S) -> list[str]:
    """vllm-router's flags for its own admission: at most ``seats`` requests in flight, ``queue``
    more held up to ``timeout_s`` each."""
    return ["--max-concurrent-requests", str(seats), "--queue-size", str(queue), "--queue-timeout-secs", str(timeout_s)]


@contextlib.contextmanager
def vllm_router(python: Path, engines: list[str], log: Path, extra: Sequence[str] = ()) -> Iterator[Proxy]:
    """vllm-router with its cache-aware policy in front of ``engines``; ``extra``: more of its flags
    (its concurrency limit, for example)."""
    port = free_port()
    cmd = [str(python.parent / "vllm-router"), "--host", "127.0.0.1", "--port", str(port), "--policy", "cache_aware",
           "--prometheus-port", str(free_port()), "--log-level", "warning", *extra, "--worker-urls", *engines]
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"vllm-router exited with {proc.returncode}:\n{log.read_text()[-2000:]}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(url + "/v1/models", timeout=2).status_code == 200:
                    break
            if time.monotonic() > deadline:
                raise RuntimeError(f"vllm-router did not answer within 120 s:\n{log.read_text()[-2000:]}")
            time.sleep(0.2)
        yield Proxy(url, proc.pid)
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def kv_events_args(pub: int, rep: int) -> list[str]:
    """vLLM's flags to publish KV events on loopback ports ``pub`` (events) and ``rep`` (replay), as the gateway reads them."""
    return ["--kv-events-config", json.dumps({"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": f"tcp://*:{pub}",
                                               "replay_endpoint": f"tcp://*:{rep}"})]


@contextlib.contextmanager
def coda_serve(
    engines: list[str],
    events: list[tuple[int, int]] | None,
    tmp: Path,
    model: Path | None,
    log: Path | None = None,
    ingress: str | dict[str, Any] | None = None,
    max_num_seqs: int | None = None,
) -> Iterator[Proxy]:
    """``coda serve`` in front of ``engines`` (with their KV events and tokenizer where given), with
    an ``ingress`` policy (a name or ``{name, params}``; default: the gateway's) and the engines'
    seats (``max_num_seqs``) where given; with ``log``, its stderr (warnings and errors) is kept
    there when it stops."""
    cfg: dict = {"backends": [{"url": u} for u in engines]}
    if events:  # real vLLM: KV events and the engine's own tokenizer, in the gateway, as a deployment runs it
        cfg["backends"] = [{"url": u, "kv_events": f"tcp://127.0.0.1:{pub}", "kv_events_replay": f"tcp://127.0.0.1:{rep}"}
                           for u, (pub, rep) in zip(engines, events)]
        cfg["indexer"] = {"tokenizer": "engine", "block_tokens": BLOCK, "tokenizer_path": str(model)}
    if max_num_seqs is not None:
        for backend in cfg["backends"]:
            backend["max_num_seqs"] = max_num_seqs
    if ingress is not None:
        cfg["policies"] = {"ingress": ingress}
    path = tmp / "coda.json"
    path.write_text(json.dumps(cfg))
    with running("serve", "--config", str(path), "--port", "0") as gw:
        try:
            yield Proxy(gw.url, gw.pid)
        finally:
            if log is not None:
                log.write_text(gw.stderr())


def door_metrics(url: str) -> dict[str, float]:
    """What `coda serve`'s /metrics says of its run so far: its event-loop lag (the mean, and the
    share of wakes more than 1 s late, the default ``telemetry.stale_after_s``); the seconds a
    worker sat idle while the door held requests, the longest such interval, and the refusals made
    while a worker was idle; the most requests in flight on one worker at once."""
    text = httpx.get(url + "/metrics", timeout=10).text
    samples = [s for fam in text_string_to_metric_families(text) for s in fam.samples]

    def one(name: str, **labels: str) -> float:
        return next(s.value for s in samples if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()))

    total, lag_sum, within_1s = one(LOOP_LAG + "_count"), one(LOOP_LAG + "_sum"), one(LOOP_LAG + "_bucket", le="1.0")
    return {"loop_lag_mean_s": lag_sum / total if total else 0.0, "loop_lag_over_1s": 1 - within_1s / total if total else 0.0,
            "idle_while_held_s": one("coda_ingress_idle_while_held_seconds"),
            "idle_while_held_longest_s": one("coda_ingress_idle_while_held_longest_seconds"),
            "refused_while_idle": int(one("coda_ingress_refused_while_idle_total")),
            "inflight_peak": int(max(s.value for s in samples if s.name == "coda_worker_inflight_peak_requests"))}
