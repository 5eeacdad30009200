"""Shared fixtures: small workloads built from the schema, the public data folder, and the
hypothesis profile every property test runs under."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from coda.workload.schema import Round, Session, ToolCall, Workload

#: public traces and measured GPU operator profiles (not part of the repository) live in the folder
#: this variable names; tests that read them skip when it is unset or the file is absent
DATA_ENV = "CODA_DATA_DIR"

# No deadline and no too-slow health check: how long an example takes depends on what else the
# machine runs, so a time limit would turn a busy machine's run red. Speed is measured by the
# benchmarks instead. A test that suppresses other health checks lists ``too_slow`` too.
settings.register_profile("coda", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("coda")


def shared_path(*parts: str) -> Path:
    """A file of the data folder (``$CODA_DATA_DIR``), or skip the test with the reason."""
    folder = os.environ.get(DATA_ENV)
    if not folder:
        pytest.skip(f"{DATA_ENV} is unset: point it at the folder holding traces/ and profiles/ to run this test")
    path = Path(folder).joinpath(*parts)
    if not path.exists():
        pytest.skip(f"{path} is absent: point {DATA_ENV} at the folder holding traces/ and profiles/")
    return path


def make_session(sid: str, start: float, rounds: list[tuple[int, int, float]], group: str | None = None, group_tokens: int = 0) -> Session:
    """rounds: (new_input_tokens, output_tokens, tool_s after)."""
    out = []
    for i, (new, o, tool) in enumerate(rounds):
        out.append(
            Round(
                new_input_tokens=new,
                output_tokens=o,
                kind="user" if i == 0 else "tool_followup",
                prefix_tokens=group_tokens if (i == 0 and group) else None,
                tool_duration_s=tool,
                tools=[ToolCall(name="Bash", duration_s=tool)] if tool else [],
            )
        )
    return Session(session_id=sid, start_s=start, rounds=out, prefix_group=group)


@pytest.fixture
def tiny_workload() -> Workload:
    sessions = [
        make_session("a", 0.0, [(2000, 50, 1.0), (300, 40, 0.5), (200, 30, 0.0)], group="g", group_tokens=1024),
        make_session("b", 0.5, [(3000, 20, 2.0), (500, 60, 0.0)], group="g", group_tokens=1024),
        make_session("c", 1.0, [(800, 10, 0.0)]),
    ]
    return Workload(sessions=sessions, meta={"duration_s": 10.0})


def pool_step(pool, held: list, op: str, chain: list[int], n: int) -> bool:
    """One of the pool tests' shared steps on an HBM pool (True when ``op`` was one): insert a chain
    when its new chunks fit (making room), keeping it in ``held``; release or discard the last one
    held; evict ``n`` chunks."""
    if op == "insert" and chain:
        fresh = [x for x in dict.fromkeys(chain) if x not in pool.resident]
        if len(fresh) <= pool.reclaimable:
            pool.make_room(len(fresh))
            pool.insert(chain)
            held.append(chain)
    elif op == "release" and held:
        pool.release(held.pop())
    elif op == "discard" and held:
        pool.discard(held.pop())
    elif op == "evict":
        pool.evict(n)
    else:
        return False
    return True


class ManualClock:
    """A clock a test sets by hand (``clock.t = ...``), in place of a shell's monotonic clock."""

    def __init__(self, t: float = 0.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t
