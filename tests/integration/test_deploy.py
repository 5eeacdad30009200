"""The deployment as an operator applies it: `kubectl kustomize` renders deploy/base and
deploy/monitoring, every object validates against the Kubernetes schemas kubernetes-validate
bundles (strict: unknown fields fail; offline), the pieces agree with each other (the gateway's
config names every vLLM pod on the ports vLLM binds, probes and scraping hit the gateway's port),
the gateway runs three replicas that share the Redis store its config names, and hadolint passes
both Dockerfiles."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit

import kubernetes_validate
import pytest
import yaml
from kubernetes_validate.utils import latest_version

from coda.gateway.config import build_config
from coda.integrations.vllm.settings import load_settings

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent  # kubectl and hadolint come from the test extra's wheels
OLDEST = "1.25.0"  # the oldest Kubernetes whose schemas the manifests must also satisfy


def render(overlay: str) -> list[dict]:
    out = subprocess.run([str(BIN / "kubectl"), "kustomize", str(ROOT / "deploy" / overlay)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def one(docs: list[dict], kind: str, name: str) -> dict:
    """The object of ``kind`` named ``name`` (a generated ConfigMap: ``name`` and kustomize's hash suffix)."""
    (doc,) = [d for d in docs if d["kind"] == kind and re.fullmatch(re.escape(name) + (r"-[a-z0-9]+" if kind == "ConfigMap" else ""),
                                                                     d["metadata"]["name"])]
    return doc


def gateway_config(docs: list[dict]):
    data = yaml.safe_load(one(docs, "ConfigMap", "coda-config")["data"]["coda.yaml"])
    return build_config(data, {}, environ={}, source="deploy/base/coda.yaml")  # what coda serve would refuse, fails here


def vllm_args(container: dict) -> dict[str, str]:
    """``--name=value`` arguments as a mapping (a bare ``--flag`` maps to '')."""
    return {k: v for k, _, v in (a.removeprefix("--").partition("=") for a in container["args"] if a.startswith("--"))}


@pytest.fixture(scope="module")
def base() -> list[dict]:
    return render("base")


@pytest.mark.parametrize("overlay", ["base", "monitoring"])
def test_every_object_validates_against_the_kubernetes_schemas(overlay):
    docs = render(overlay)
    validated = []
    for doc in docs:
        if doc["apiVersion"].startswith("monitoring.coreos.com/"):
            continue  # a CRD: checked against the Services below, its schema is the operator's
        for version in (OLDEST, latest_version()):
            kubernetes_validate.validate(doc, version, strict=True)
        validated.append(doc["kind"])
    assert sorted(validated) == [
        "ConfigMap",
        "Deployment",
        "Deployment",
        "PodDisruptionBudget",
        "Service",
        "Service",
        "Service",
        "StatefulSet",
    ]


def test_the_servicemonitors_select_the_services_and_their_metrics_ports():
    docs = render("monitoring")
    services = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Service"}
    monitors = [d for d in docs if d["kind"] == "ServiceMonitor"]
    assert {m["metadata"]["name"] for m in monitors} == {"coda", "vllm"}  # Redis serves no /metrics
    for m in monitors:
        svc = services[m["metadata"]["name"]]
        assert m["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
        assert {e["port"] for e in m["spec"]["endpoints"]} <= {p["name"] for p in svc["spec"]["ports"]}


def test_the_gateway_config_is_valid_and_names_every_vllm_pod_on_the_ports_vllm_binds(base):
    cfg = gateway_config(base)

    sts = one(base, "StatefulSet", "vllm")
    headless = one(base, "Service", sts["spec"]["serviceName"])
    assert headless["spec"]["clusterIP"] == "None"
    assert headless["spec"]["selector"].items() <= sts["spec"]["template"]["metadata"]["labels"].items()
    (engine,) = sts["spec"]["template"]["spec"]["containers"]
    ports = {p["name"]: p["containerPort"] for p in engine["ports"]}
    args = vllm_args(engine)
    events = json.loads(args["kv-events-config"])
    assert events["enable_kv_cache_events"] and events["publisher"] == "zmq"
    assert events["endpoint"] == f"tcp://*:{ports['kv-events']}" and events["replay_endpoint"] == f"tcp://*:{ports['kv-replay']}"
    assert args["scheduler-cls"] == "coda.integrations.vllm.scheduler.CodaScheduler" and args["port"] == str(ports["http"])
    assert "enable-prefix-caching" in args
    # the scheduler's settings load as the engine loads them (an unknown key would stop it at startup)
    env = {e["name"]: e["value"] for e in engine["env"]}
    settings = load_settings(env)
    assert settings.policy_spec.state.params == {"tau_s": 5.0, "w_max_s": 20.0}

    pods = [f"{sts['metadata']['name']}-{i}.{headless['metadata']['name']}" for i in range(sts["spec"]["replicas"])]
    assert [(b.url, b.kv_events, b.kv_events_replay) for b in cfg.backends] == [
        (f"http://{pod}:{ports['http']}", f"tcp://{pod}:{ports['kv-events']}", f"tcp://{pod}:{ports['kv-replay']}") for pod in pods
    ]
    assert cfg.indexer.tokenizer == "engine" and cfg.indexer.block_tokens == int(args["block-size"])
    assert [b.max_num_seqs for b in cfg.backends] == [int(args["max-num-seqs"])] * len(pods)  # the seats the gateway counts are vLLM's
    assert cfg.host == "0.0.0.0"


def test_the_gateway_deployment_probes_scrapes_and_mounts_what_coda_serve_uses(base):
    cfg = gateway_config(base)
    dep = one(base, "Deployment", "coda")
    pod = dep["spec"]["template"]
    (gw,) = pod["spec"]["containers"]
    assert {p["name"]: p["containerPort"] for p in gw["ports"]} == {"http": cfg.port}
    assert gw["readinessProbe"]["httpGet"] == {"path": "/ready", "port": "http"}
    assert gw["livenessProbe"]["httpGet"] == {"path": "/health", "port": "http"}
    # the startup probe outlasts the gateway's wait for the engines
    startup = gw["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] > cfg.telemetry.startup_timeout_s
    assert pod["spec"]["terminationGracePeriodSeconds"] > cfg.drain_timeout_s
    assert pod["metadata"]["annotations"]["prometheus.io/port"] == str(cfg.port)
    config_path = gw["args"][gw["args"].index("--config") + 1]
    (mount,) = [m for m in gw["volumeMounts"] if config_path.startswith(m["mountPath"] + "/")]
    (volume,) = [v for v in pod["spec"]["volumes"] if v["name"] == mount["name"]]
    assert volume["configMap"]["name"] == one(base, "ConfigMap", "coda-config")["metadata"]["name"]  # the hashed name
    assert pod["spec"]["securityContext"]["runAsNonRoot"] and gw["securityContext"]["readOnlyRootFilesystem"]
    svc = one(base, "Service", "coda")
    assert svc["spec"]["selector"].items() <= pod["metadata"]["labels"].items()


def test_three_gateway_replicas_of_which_a_disruption_leaves_two(base):
    dep = one(base, "Deployment", "coda")
    assert dep["spec"]["replicas"] == 3
    pdb = one(base, "PodDisruptionBudget", "coda")
    assert pdb["spec"]["minAvailable"] == 2 < dep["spec"]["replicas"]  # a drain can still take one replica
    assert pdb["spec"]["selector"]["matchLabels"].items() <= dep["spec"]["template"]["metadata"]["labels"].items()
    (gw,) = dep["spec"]["template"]["spec"]["containers"]
    assert gw["readinessProbe"]["httpGet"]["path"] == "/ready"  # the Service drops a draining or engine-less replica


@pytest.mark.parametrize("dockerfile", ["Dockerfile", "deploy/vllm.Dockerfile"])
def test_the_dockerfiles_pass_hadolint(dockerfile):
    out = subprocess.run([str(BIN / "hadolint"), "--no-color", str(ROOT / dockerfile)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr


def test_the_gateway_image_runs_as_a_user_and_checks_ready():
    final = (ROOT / "Dockerfile").read_text().rsplit("\nFROM ", 1)[1]  # the last stage is the image
    user = re.search(r"^USER (\S+)", final, re.M)
    assert user and user.group(1).split(":")[0] not in ("root", "0")
    assert re.search(r"^HEALTHCHECK .*CODA_HEALTH_URL", final, re.M | re.S) and "CODA_HEALTH_URL=http://127.0.0.1:8080/ready" in final


def test_the_replicas_store_is_the_redis_service_without_persistence(base):
    cfg = gateway_config(base)
    url = urlsplit(cfg.store.url)
    assert url.scheme == "redis" and cfg.store.on_unreachable == "open"  # a store outage costs fleet-wide limits, not serving
    svc = one(base, "Service", url.hostname)  # the host the gateway dials is the Service's name
    (port,) = [p for p in svc["spec"]["ports"] if p["port"] == url.port]
    dep = one(base, "Deployment", "coda-redis")
    pod = dep["spec"]["template"]
    assert svc["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
    (redis,) = pod["spec"]["containers"]
    assert {p["name"]: p["containerPort"] for p in redis["ports"]}[port["targetPort"]] == url.port
    assert redis["image"].startswith("redis:7")
    args = redis["args"]
    assert args[args.index("--save") + 1] == "" and args[args.index("--appendonly") + 1] == "no"  # soft state: nothing on disk
