"""``benchmarks/cuda_check.py`` is run by hand on the rare sessions lent a GPU; here its
checks run on the CPU in every suite, so a change to the rules or the sampling that
breaks the script (or its checks) shows up before the next GPU session does."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from vllm_hetero_spec.host_to_device import to_device

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "cuda_check.py"


def _load():
    spec = importlib.util.spec_from_file_location("cuda_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_device_check_passes_on_the_cpu(tmp_path: Path) -> None:
    module = _load()
    result = module.main(["--device", "cpu", "--no-engine", "--samples", "20000", "--seeds", "2", "--no-timings",
                          "--out", str(tmp_path)])
    assert result["ok"], result
    assert result["agreement"]["rows_differing"] == 0
    assert (tmp_path / "cuda_check.md").read_text().count("| lossless:") == 4


def test_the_gpu_check_says_what_it_would_run_and_refuses_without_cuda(tmp_path: Path, capsys) -> None:
    """The one-command GPU check's dry run prints both stages' plan (both attention
    backends, the checks, what the machine needs) and writes nothing; a real run without
    CUDA exits 2 with the reason, having run nothing."""
    module = _load()
    result = module.main(["--dry-run", "--out", str(tmp_path)])
    plan = capsys.readouterr().out
    assert result["dry_run"] and result["ok"] and not any(tmp_path.iterdir())
    for needle in ("FLASH_ATTN", "FLASHINFER", "greedy identical", "chi-square", "graphs", "draft forward ms",
                   "vLLM 0.32.0's or 0.33.0's CUDA build"):
        assert needle in plan, needle
    assert not torch.cuda.is_available()
    for argv in ([], ["--device", "cpu"]):
        with pytest.raises(SystemExit) as stop:
            module.main([*argv, "--out", str(tmp_path)])
        assert stop.value.code == 2 and "refusing" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())


def test_host_values_land_on_the_asked_device_with_their_dtype() -> None:
    t = to_device([[1, 2], [3, 4]], torch.float64, torch.device("cpu"))
    assert t.dtype == torch.float64 and t.tolist() == [[1.0, 2.0], [3.0, 4.0]]
    with FakeTensorMode(allow_non_fake_inputs=False):
        on_cuda = to_device([True, False], torch.bool, torch.device("cuda"))
        assert on_cuda.device.type == "cuda" and on_cuda.dtype == torch.bool
