"""Shared fixtures: small workloads built from the schema, and the shared data folder."""

from __future__ import annotations

from pathlib import Path

import pytest

from coda.workload.schema import Round, Session, ToolCall, Workload

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"


def shared_path(*parts: str) -> Path:
    """A file under ../shared, or skip the test with the reason."""
    path = SHARED.joinpath(*parts)
    if not path.exists():
        pytest.skip(f"{path} is absent (shared data folder not mounted next to the project)")
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
