"""The shipped config files parse and validate (without building models)."""

from pathlib import Path

import pytest

from vllm_hetero_spec.config import HETERO_KEYS, load_spec_dict

CONFIGS = sorted((Path(__file__).parents[1] / "configs").glob("*.json"))


@pytest.mark.parametrize("path", CONFIGS, ids=[p.name for p in CONFIGS])
def test_config_file_is_valid(path: Path) -> None:
    spec = load_spec_dict(str(path))
    assert spec["method"] == "hetero"
    known = set(HETERO_KEYS) | {"method", "model", "num_speculative_tokens"}
    assert set(spec) <= known, set(spec) - known
