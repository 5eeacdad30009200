"""The base install is what vLLM's scheduler plugin needs: the plugin imports none of the packages
that the sim, gateway and plots extras add, ``import coda`` stays light, and a command that needs
a missing extra says which one to install."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import tomllib
from importlib.metadata import packages_distributions
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from coda.errors import EXTRA_OF

ROOT = Path(__file__).resolve().parents[2]
EXCLUDED = ("matplotlib", "numba", "starlette", "uvicorn", "typer", "rich")
# The scheduler's process is vLLM's engine, which has torch; the scheduler module itself needs none of it.
HEAVY = ("torch",)


def block(names: tuple[str, ...]) -> str:
    """Code that makes ``names`` unimportable, as in an environment that lacks their extras."""
    return textwrap.dedent(f"""
        import importlib.abc, sys
        class Block(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                if name.partition(".")[0] in {names!r}:
                    raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        sys.meta_path.insert(0, Block())
    """)


# vLLM itself is not in this environment: the names the plugin imports from it, as the empty base
# classes and stand-ins they are to the import (the real-vLLM tests run the plugin in vLLM).
FAKE_VLLM = textwrap.dedent("""
    import logging, types
    for name in ("vllm", "vllm.logger", "vllm.utils", "vllm.utils.import_utils", "vllm.v1", "vllm.v1.core", "vllm.v1.core.sched",
                 "vllm.v1.core.sched.async_scheduler", "vllm.v1.core.sched.request_queue", "vllm.v1.core.sched.scheduler",
                 "vllm.v1.request"):
        sys.modules[name] = types.ModuleType(name)
    sys.modules["vllm"].__version__ = "0.32.0"
    sys.modules["vllm.logger"].init_logger = logging.getLogger
    sys.modules["vllm.utils.import_utils"].resolve_obj_by_qualname = None
    sys.modules["vllm.v1.core.sched.request_queue"].RequestQueue = type("RequestQueue", (), {})
    sys.modules["vllm.v1.core.sched.scheduler"].Scheduler = type("Scheduler", (), {})
    sys.modules["vllm.v1.core.sched.async_scheduler"].AsyncScheduler = type(
        "AsyncScheduler", (sys.modules["vllm.v1.core.sched.scheduler"].Scheduler,), {})
    sys.modules["vllm.v1.request"].RequestStatus = type("RequestStatus", (), {})
""")


def run_probe(code: str, prelude: str = "", blocked: tuple[str, ...] = EXCLUDED + HEAVY) -> subprocess.CompletedProcess:
    script = block(blocked) + prelude + textwrap.dedent(code)
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=ROOT)


def test_the_vllm_plugin_imports_none_of_the_extras_and_builds_its_policy():
    proc = run_probe("""
        import json
        import coda
        light = sorted(m for m in sys.modules if m.startswith("coda."))
        from coda.integrations.vllm import scheduler
        from coda.protocol import kv_events
        from coda.cost.model import build_cost_model
        from coda.cost.profile import load_profile
        from coda.errors import CodaError
        from coda.integrations.vllm.settings import load_settings
        from coda.shell.build import build_policies
        settings = load_settings({})
        spec = settings.policy_spec
        from coda.integrations.vllm.settings import ENFORCED
        policy = build_policies(spec, build_cost_model(load_profile(settings.profile)), kinds=ENFORCED).state
        try:
            build_cost_model(load_profile("a100-qwen3coder30b-fp8-fa2"))  # has an attention section: the numba kernel model
            kernel_error = None
        except CodaError as err:
            kernel_error = str(err)
        tops = sorted({m.partition(".")[0] for m in sys.modules})
        print(json.dumps({"light": light, "tops": tops, "frontier": policy.frontier, "kernel_error": kernel_error}))
    """, prelude=FAKE_VLLM)
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout)
    assert got["light"] == [], "import coda loads submodules eagerly"
    assert not set(EXCLUDED) & set(got["tops"])
    assert got["frontier"] == 64
    err = got["kernel_error"]
    assert err is not None and "\n" not in err and "numba" in err and "pip install 'coda[sim]'" in err


@pytest.mark.parametrize(
    ("argv", "blocked", "extra"),
    [
        (["sim"], EXCLUDED, "all"),  # the base install: no command line at all
        # coda[gateway] without coda[plots]: refused before the run, whose figures would fail at its end
        (
            ["bench", "--endpoint", "http://127.0.0.1:9", "--workload", "synth:rate=1,duration=10", "--out", "unused"],
            ("matplotlib",),
            "plots",
        ),
    ],
    ids=["base-install", "bench-without-plots"],
)
def test_a_command_without_its_extra_prints_one_line_naming_it(argv, blocked, extra):
    proc = run_probe(
        f"""
        sys.argv = ["coda", *{argv!r}]
        from coda.cli import main
        main()
    """,
        blocked=blocked,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and f"pip install 'coda[{extra}]'" in proc.stderr, proc.stderr


def test_the_base_install_leaves_the_extras_out_and_each_optional_module_names_its_extra():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    names = {extra: {canonicalize_name(Requirement(r).name) for r in reqs} for extra, reqs in project["optional-dependencies"].items()}
    names["all"] = names["sim"] | names["gateway"] | names["plots"] | names["ray"]
    base = {canonicalize_name(Requirement(r).name) for r in project["dependencies"]}
    assert not base & {canonicalize_name(n) for n in EXCLUDED} and names["scheduler"] == set()
    dist_of = packages_distributions()
    for module, extra in EXTRA_OF.items():
        dists = {canonicalize_name(d) for d in dist_of[module]}
        assert dists & names[extra], f"{module} ({dists}) is not in coda[{extra}]"
