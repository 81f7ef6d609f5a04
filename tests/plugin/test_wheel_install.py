"""The plugin as a user installs it: a wheel, with the compiled alignment core, put into
a fresh venv that sees an existing vLLM (the project venv's, standing in for the user's
own). Installing must leave that vLLM and its torch alone, vLLM must find the plugin
through its entry point, and a hetero config must parse there."""

from __future__ import annotations

import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

CHECK = """
import importlib.metadata as md, json, sys
import vllm, torch
from vllm.plugins import load_general_plugins
import vllm_hetero_spec
from vllm_hetero_spec import _alignment
from vllm_hetero_spec.config import parse_settings
(ep,) = [e for e in md.entry_points(group="vllm.general_plugins") if e.name == "hetero_spec"]
load_general_plugins()
from vllm_hetero_spec.vllm_integration import patching
settings, spec = parse_settings({"method": "hetero", "model": sys.argv[1], "num_speculative_tokens": 3})
print(json.dumps({"module": vllm_hetero_spec.__file__, "alignment": _alignment.__file__, "entry": ep.value,
                  "active": bool(patching.APPLIED), "vllm": vllm.__version__, "torch": torch.__version__,
                  "proposer": spec["model"]}))
"""


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The plugin's wheel, built from this checkout as ``pip wheel`` builds it (the
    Cython core compiled), with the project venv's build tools, offline."""
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(out),
                    str(ROOT)], check=True, capture_output=True, text=True, timeout=600)
    (built,) = out.glob("vllm_hetero_spec-*.whl")
    return built


def test_the_wheel_installs_beside_a_users_vllm_and_vllm_loads_it(wheel: Path, tmp_path: Path, smollm2: str) -> None:
    import torch
    import vllm

    env_dir = tmp_path / "user-venv"
    venv.EnvBuilder(with_pip=False).create(env_dir)
    python = env_dir / "bin" / "python"
    site = Path(subprocess.check_output([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                        text=True).strip())
    # The user's environment: the project venv's packages (vLLM, torch, ...), seen but
    # not processed (its editable installs of this checkout stay out of the way).
    (site / "user_vllm.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    pip = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-index",
                          str(wheel)], capture_output=True, text=True, timeout=600)
    assert pip.returncode == 0, pip.stdout + pip.stderr
    # Offline (--no-index): every dependency is met by what the user has, so the wheel is
    # all pip installs.
    installed = [line for line in pip.stdout.splitlines() if line.startswith("Successfully installed")]
    assert installed == [f"Successfully installed vllm-hetero-spec-{wheel.name.split('-')[1]}"], pip.stdout

    run = subprocess.run([str(python), "-c", CHECK, smollm2], capture_output=True, text=True, timeout=300,
                         cwd=tmp_path, env={"PATH": "/usr/bin:/bin", "HOME": str(Path.home())})
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    import json

    seen = json.loads(run.stdout.strip().splitlines()[-1])
    assert seen["module"].startswith(str(site)) and seen["alignment"].startswith(str(site))  # the wheel's, compiled
    assert seen["entry"] == "vllm_hetero_spec:register" and seen["active"]
    assert (seen["vllm"], seen["torch"]) == (vllm.__version__, torch.__version__)  # left alone
    assert seen["proposer"] == "vllm_hetero_spec.vllm_integration.proposer.HeteroProposer"
