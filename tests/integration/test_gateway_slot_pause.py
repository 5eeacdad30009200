"""A capped ``predicted_wait`` door (one session slot) in front of a `coda fake-engine`: a new
session refused while an earlier session's request holds the slot is admitted once that session
has not come back within its pause, long before the session TTL. The door counts slots in the
store, so the store must hear the request end: in one gateway process, over `coda serve
--workers 2`'s one-host store, and over Redis."""

from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest
import yaml

from coda.engines.launch import FakeEngineProcess
from coda.serving.procs import running
from tests.integration.redis_server import redis_server  # noqa: F401  (a fixture)
from tests.waiting import wait_until

pytestmark = pytest.mark.timeout(300)
MODEL = "coda-fake"
#: one slot; a short pause before a session has shown one; a TTL no wait here reaches (the hang
#: guard is shorter); a deferral budget the late session's retries never spend
INGRESS = {"name": "predicted_wait", "params": {"adaptive_cap": False, "max_sessions": 1, "first_pause_s": 0.5, "pause_margin_s": 0.5,
                                                "idle_ttl_s": 600.0, "defer_budget_s": 600.0}}


@pytest.fixture(scope="module")
def engine() -> Iterator[FakeEngineProcess]:
    with FakeEngineProcess("--speedup", "10") as e:
        yield e


def ask(c: openai.OpenAI, session: str) -> None:
    c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": f"a round of {session}"}], max_tokens=2,
                              extra_headers={"x-session-id": session})


def admitted(c: openai.OpenAI, session: str) -> bool:
    """One try of a round of ``session``: False while every slot is taken."""
    try:
        ask(c, session)
    except openai.APIStatusError as err:
        if err.status_code == 503 and err.body["code"] == "session_slots_full":
            return False
        raise
    return True


@pytest.mark.parametrize("store", ["in-process", "one-host", "redis"])
def test_a_capped_door_admits_a_new_session_once_the_earlier_one_paused_past_its_slot(tmp_path, engine, store, request):
    cfg = {"backends": [engine.url], "telemetry": {"scrape_interval_s": 0.05}, "policies": {"ingress": INGRESS}}
    if store == "redis":
        cfg["store"] = {"url": request.getfixturevalue("redis_server").url}
    path = tmp_path / "coda.yaml"
    path.write_text(yaml.safe_dump(cfg))
    workers = ["--workers", "2"] if store == "one-host" else []
    with running("serve", "--config", str(path), "--port", "0", *workers) as gw:
        c = openai.OpenAI(base_url=gw.url + "/v1", api_key="k", max_retries=0, timeout=60)
        early = c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "a long task"}], max_tokens=3000, stream=True,
                                          extra_headers={"x-session-id": "early"})
        next(iter(early))  # admitted and in flight: it holds the one slot, and its pause cannot run
        assert not admitted(c, "late")
        early.close()  # its request ends, and the early session does not come back
        wait_until(lambda: admitted(c, "late"), "the late session is admitted once the early session's slot lapsed by its pause")
