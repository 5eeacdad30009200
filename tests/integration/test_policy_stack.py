"""One policy stack for every shell: the same ``policies`` block selects the same policy objects in
``coda sim``, ``coda serve`` and the vLLM plugin, and a policy another package registers through
the ``coda.policies`` entry point runs in ``coda sim`` and ``coda serve`` with no change to Coda
(the package is docs/policies.md's example, installed as a distribution on the path)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import httpx
import yaml

from coda.cost.model import build_cost_model
from coda.cost.profile import load_profile
from coda.engines.launch import FakeEngineProcess
from coda.gateway.config import build_config
from coda.gateway.prompt import make_tokenizer
from coda.gateway.view import GatewayState
from coda.integrations.vllm.settings import CONFIG_ENV, ENFORCED, load_settings
from coda.serving.procs import running
from coda.shell.build import build_policies
from coda.shell.shadow import Shadowed
from coda.sim.cluster import Simulation
from coda.sim.config import SimConfig
from coda.workload.spec import load_workload

ROOT = Path(__file__).resolve().parents[2]
BLOCK = {
    "system": "coda",
    "policies": {
        "ingress": {"name": "session+overload", "params": {"session": {"max_sessions": 8}, "overload": {"max_inflight": 16}}},
        "router": {"name": "coda", "params": {"load_slack": 2, "parent": {"slack": 3}}, "shadow": "smetric"},
        "state": {"params": {"tau_s": 3.0, "w_max_s": 30.0}, "shadow": "fewest_blocks"},
    },
}


def test_the_same_block_selects_the_same_policy_objects_in_every_shell():
    sim = Simulation(load_workload("synth:rate=1,duration=120,seed=0"), SimConfig(workers=2, **BLOCK)).policies
    gateway = GatewayState(build_config({"backends": ["http://127.0.0.1:1"], **BLOCK}, {}, {}), make_tokenizer("chars")).policies
    settings = load_settings({CONFIG_ENV: json.dumps(BLOCK)})
    plugin = build_policies(settings.policy_spec, build_cost_model(load_profile(settings.profile)), kinds=ENFORCED)
    assert sim.spec == gateway.spec == plugin.spec
    assert sim.ingress == gateway.ingress and sim.router == gateway.router
    assert (sim.state, sim.execution, sim.eviction) == (plugin.state, plugin.execution, plugin.eviction)
    assert isinstance(sim.router, Shadowed) and sim.router.primary.load_slack == 2 and sim.router.primary.parent.slack == 3
    assert sim.state.primary.tau_s == 3.0 and sim.state.shadow.name == "fewest_blocks"
    # each shell builds what it enforces and leaves the rest to the others
    assert gateway.state is None and plugin.router is None and plugin.ingress is None


def example_package(tmp: Path) -> Path:
    """docs/policies.md's example policy as an installed distribution with its entry point."""
    doc = (ROOT / "docs" / "policies.md").read_text()
    code = re.search(r"```python\n(# my_policies\.py\n.*?)```", doc, re.S).group(1)
    entry = re.search(r'^"(router\.\w+)" = "(my_policies:\w+)"$', doc, re.M)
    site = tmp / "site"
    (site / "my_policies-0.1.dist-info").mkdir(parents=True)
    (site / "my_policies.py").write_text(code)
    (site / "my_policies-0.1.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: my-policies\nVersion: 0.1\n")
    (site / "my_policies-0.1.dist-info" / "entry_points.txt").write_text(f"[coda.policies]\n{entry.group(1)} = {entry.group(2)}\n")
    return site


def env_with(site: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH")) if p)}


def test_a_policy_from_another_package_runs_in_coda_sim_and_coda_serve(tmp_path):
    site = example_package(tmp_path)
    cfg = tmp_path / "sim.yaml"
    cfg.write_text(
        yaml.safe_dump({"workload": "synth:rate=2,duration=300,seed=1", "workers": 2, "policies": {"router": "fewest_kv_blocks"}})
    )
    proc = subprocess.run(
        [sys.executable, "-m", "coda.cli", "sim", "--config", str(cfg), "--json", "--out", str(tmp_path / "sim")],
        capture_output=True,
        text=True,
        timeout=300,
        env=env_with(site),
    )
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    assert summary["config"]["policies"]["router"]["name"] == "fewest_kv_blocks" and summary["completed"] > 0
    workers = {json.loads(line)["worker"] for line in (tmp_path / "sim" / "requests.jsonl").read_text().splitlines()}
    assert workers == {0, 1}  # it routed: both workers served

    with FakeEngineProcess("--speedup", "50") as e0, FakeEngineProcess("--speedup", "50") as e1:
        serve_cfg = tmp_path / "coda.yaml"
        serve_cfg.write_text(
            yaml.safe_dump(
                {
                    "backends": [{"url": e0.url, "name": "first"}, {"url": e1.url, "name": "second"}],
                    "auth": {"admin_key": "admin"},
                    "policies": {"router": {"name": "fewest_kv_blocks"}},
                }
            )
        )
        with running("serve", "--config", str(serve_cfg), "--port", "0", env=env_with(site)) as gw:
            state = httpx.get(gw.url + "/debug/state", headers={"authorization": "Bearer admin"}).json()
            assert state["router"] == "fewest_kv_blocks"
            body = {"model": "coda-fake", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 2}
            served = {httpx.post(gw.url + "/v1/chat/completions", json=body, timeout=60).headers["x-coda-worker"] for _ in range(3)}
            assert served == {"first"}  # one at a time, nothing held anywhere: the tie goes to the lowest id
