"""``benchmarks/cuda_check.py`` is run by hand on the rare sessions lent a GPU; here its
checks run on the CPU in every suite, so a change to the rules or the sampling that
breaks the script (or its checks) shows up before the next GPU session does."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from vllm_hetero_spec.host_to_device import to_device

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "cuda_check.py"


def test_the_device_check_passes_on_the_cpu(tmp_path: Path) -> None:
    spec = importlib.util.spec_from_file_location("cuda_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    result = module.main(["--device", "cpu", "--samples", "20000", "--seeds", "2", "--no-timings", "--out", str(tmp_path)])
    assert result["ok"], result
    assert result["agreement"]["rows_differing"] == 0
    assert (tmp_path / "cuda_check.md").read_text().count("| lossless:") == 4


def test_host_values_land_on_the_asked_device_with_their_dtype() -> None:
    t = to_device([[1, 2], [3, 4]], torch.float64, torch.device("cpu"))
    assert t.dtype == torch.float64 and t.tolist() == [[1.0, 2.0], [3.0, 4.0]]
    with FakeTensorMode(allow_non_fake_inputs=False):
        on_cuda = to_device([True, False], torch.bool, torch.device("cuda"))
        assert on_cuda.device.type == "cuda" and on_cuda.dtype == torch.bool
