"""The installed plugin is the plugin alone: it imports nothing of the project's
harness (``harness/``, a distribution of its own), and its start-up installs nothing."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_no_plugin_module_imports_the_harness() -> None:
    offenders = [
        str(path.relative_to(ROOT)) for path in (ROOT / "vllm_hetero_spec").rglob("*.py")
        if re.search(r"^\s*(from|import)\s+hetero_harness\b", path.read_text(), re.MULTILINE)
    ]
    assert offenders == []


def test_loading_the_whole_plugin_loads_no_harness_module() -> None:
    """Every module vLLM can reach, imported in a fresh process (the harness is
    importable there, so only an import would load it)."""
    code = (
        "import sys, vllm_hetero_spec, vllm_hetero_spec.vllm_integration, "
        "vllm_hetero_spec.vllm_integration.startup_checks, vllm_hetero_spec.vllm_integration.proposer, "
        "vllm_hetero_spec.verify.sampler, vllm_hetero_spec.drafter.batch_drafter; "
        "vllm_hetero_spec.vllm_integration.apply(); import hetero_harness; "
        "print(sorted(m for m in sys.modules if m.startswith('hetero_harness.')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd="/", check=True)
    assert out.stdout.strip().splitlines()[-1] == "[]", out.stdout[-2000:]


def test_the_plugin_wheel_holds_the_plugin_only() -> None:
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert re.search(r'include = \["vllm_hetero_spec\*"\]', pyproject)
    assert "hetero_harness" in (ROOT / "harness" / "pyproject.toml").read_text()
