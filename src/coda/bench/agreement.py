"""The agreement replay: one workload in ``coda sim`` and through ``coda bench`` on ``coda
fake-engine`` at real time, which run the same worker, scheduler and cost model. The agreement
test checks that they replay the same requests; ``benchmarks/bench_agreement.py`` measures how
closely their timings agree on this machine."""

from __future__ import annotations

from pathlib import Path

import httpx
import numpy as np

from coda.bench.engine_replay import coda
from coda.engines.launch import FakeEngineProcess
from coda.workload.schema import Round, Session, Workload, write_workload

DURATION_S = 18.0


def agreement_workload(seed: int = 0) -> Workload:
    """Five sessions of eight rounds started 1.5 s apart: 2.5-3.5K-token first prompts, 2-3K appended
    per round, 80-160 output tokens, 0.5-1 s tools. Prefills rarely collide, so a few milliseconds of
    HTTP and timer jitter cannot cascade into a different schedule (with multi-second prefills
    colliding, the simulator itself moves by 15% under 30 ms of jitter)."""
    rng = np.random.default_rng(seed)
    sessions = []
    for i in range(5):
        rounds = [
            Round(
                new_input_tokens=int(rng.integers(2500, 3500) if k == 0 else rng.integers(2000, 3000)),
                output_tokens=int(rng.integers(80, 160)),
                kind="user" if k == 0 else "tool_followup",
                tool_duration_s=round(float(rng.uniform(0.5, 1.0)), 3),
            )
            for k in range(8)
        ]
        sessions.append(Session(session_id=f"agree-{i}", start_s=1.5 * i, rounds=rounds))
    return Workload(sessions=sessions, meta={"source": "agreement test", "seed": seed, "duration_s": DURATION_S})


def replay(tmp: Path) -> tuple[dict, dict, Path, Path]:
    """The agreement workload in ``coda sim`` and through ``coda bench`` on a fake engine at speedup 1:
    (sim summary, bench summary, sim folder, bench folder)."""
    path = tmp / "agreement.jsonl"
    write_workload(agreement_workload(), path)
    sim = coda("sim", "--workload", str(path), "--workers", "1", "--seed", "0", "--out", str(tmp / "sim"))
    warmup, end = sim["window_s"]
    with FakeEngineProcess("--speedup", "1") as engine:
        bench = coda(
            "bench",
            "--endpoint",
            engine.url,
            "--workload",
            str(path),
            "--warmup-s",
            str(warmup),
            "--duration",
            str(end),
            "--drain-s",
            "30",
            "--out",
            str(tmp / "bench"),
        )
        bench["engine_late_max_s"] = engine_late_s(engine.url)
    return sim, bench, tmp / "sim", tmp / "bench"


def engine_late_s(url: str) -> float:
    """How late the fake engine's real-time loop ran its worst event (the machine could not keep up)."""
    text = httpx.get(url + "/metrics").text
    return max(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith("coda:fake_engine_late_max_seconds"))
