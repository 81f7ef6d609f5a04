"""The shipped config files parse and validate (parsing builds no model)."""

from pathlib import Path

import pytest

from vllm_hetero_spec.config import load_spec_dict, parse_settings

CONFIGS = sorted((Path(__file__).parents[2] / "configs").glob("*.json"))


@pytest.mark.parametrize("path", CONFIGS, ids=[p.name for p in CONFIGS])
def test_config_file_is_valid(path: Path) -> None:
    spec = load_spec_dict(str(path))
    assert spec["method"] == "hetero"
    settings, vllm_spec = parse_settings(spec)
    assert vllm_spec["method"] == "custom_class"
    assert set(vllm_spec) == {"method", "model", "num_speculative_tokens"}, vllm_spec
    assert settings.num_speculative_tokens == spec["num_speculative_tokens"]
