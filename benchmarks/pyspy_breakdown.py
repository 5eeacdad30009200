"""Where a vLLM process's threads spend their time: a py-spy raw profile (``py-spy record --idle
--threads --format raw``) of an API server or an EngineCore, each thread's samples split into HTTP
and SSE, tokenization, detokenization, scheduling, forward, sampling, metrics scrapes and idle.

A sample is a thread's stack at one instant; a thread waiting for a busy core is sampled in the
code it will run, so on a shared machine "busy" is wall time in that code, not CPU (read the
process's CPU from /proc beside it). Categories go by the frames of the stack, first match wins.

    python benchmarks/pyspy_breakdown.py api.txt [core.txt ...]
"""

from __future__ import annotations

import collections
import re
import sys

#: leaves where a thread waits (a lock, a poll, an event loop in C, an idle pool worker)
IDLE_LEAVES = ("Condition.wait", "Poller.poll", "_PollLikeSelector.select", "EpollSelector.select", "_worker", "Event.wait",
               "Runner.run", "sleep", "Queue.get", "_wait_for_tstate_lock", "select", "poll")
#: (category, pattern over the whole stack), first match wins
CATEGORIES = (
    ("metrics scrapes (/metrics)", r"prometheus"),
    ("detokenization", r"detokeniz|Detokenizer|convert_ids_to_tokens|decode_next"),
    ("tokenization", r"tokeniz|_encode_plus|renderers/|preprocess|InputPreprocessor"),
    ("sampling", r"sample/|Sampler|sample_tokens"),
    ("scheduling", r"core/sched/|kv_cache_manager|block_pool|Scheduler\."),
    ("forward (with input preparation)", r"execute_model|model_executor|_model_forward|torch/"),
    ("output processing (other)", r"output_processor|OutputProcessor|output_handler|process_outputs"),
    ("HTTP and SSE", r"serving_completion|serving_chat|completion_stream_generator|uvicorn|starlette|fastapi|h11|httptools|json"),
    ("IPC (ZMQ, serialization)", r"zmq|serial_utils|msgspec|process_output_sockets|process_input_sockets"),
)


def category(frames: list[str]) -> str:
    leaf = re.sub(r" \(.*", "", frames[-1])
    if leaf in IDLE_LEAVES or leaf.endswith((".wait", "poll")):
        return "idle"
    text = ";".join(frames)
    return next((name for name, pattern in CATEGORIES if re.search(pattern, text)), "other")


def breakdown(path: str) -> dict[str, collections.Counter[str]]:
    """Samples per category for each thread (the first frame of a ``--threads`` stack)."""
    threads: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    with open(path) as fh:
        for line in fh:
            if not line.strip():
                continue
            stack, n = line.rstrip("\n").rsplit(" ", 1)
            thread, *frames = stack.split(";")
            threads[thread][category(frames or [thread])] += int(n)
    return threads


def main(paths: list[str]) -> None:
    for path in paths:
        print(path)
        for thread, counts in sorted(breakdown(path).items(), key=lambda kv: -sum(kv[1].values())):
            n = sum(counts.values())
            shares = ", ".join(f"{k} {v / n:.1%}" for k, v in counts.most_common() if v / n >= 0.002)
            print(f"  {thread}: {n} samples, not idle {1 - counts['idle'] / n:.1%}: {shares}")


if __name__ == "__main__":
    main(sys.argv[1:])
