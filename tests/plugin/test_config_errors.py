"""Bad hetero configs fail at start-up, naming the key and the fix; vLLM's own still work."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from vllm.engine.arg_utils import EngineArgs

from vllm_hetero_spec.config import HeteroConfigError


def _engine_config(target: str, spec):
    return EngineArgs(model=target, dtype="float32", max_model_len=512, speculative_config=spec).create_engine_config()


@pytest.mark.parametrize(
    "override,key",
    [
        ({"algorithm": "magic"}, "'algorithm'"),
        ({"num_speculative_tokens": 0}, "'num_speculative_tokens'"),
        ({"num_speculative_tokens": "4"}, "'num_speculative_tokens'"),
        ({"model": "/nonexistent/draft"}, "'model'"),
        ({"model": None}, "'model'"),
        ({"draft_dtype": "int3"}, "'draft_dtype'"),
        ({"lookbehind": -1}, "'lookbehind'"),
        ({"draft_tokenizer": "/nonexistent/tok"}, "'draft_tokenizer'"),
        ({"min_shared_tokens": 10_000_000}, "'min_shared_tokens'"),
        ({"executor": "threads"}, "'executor'"),
        ({"pipeline": False}, "'pipeline'"),  # a Ray-only key without the Ray executor
        ({"max_branches": 2}, "'max_branches'"),
        ({"draft_budget": "greedy"}, "'draft_budget'"),
        ({"min_speculative_tokens": -1}, "'min_speculative_tokens'"),
        ({"executor": "ray", "ray_timeout_s": 0}, "'ray_timeout_s'"),
        ({"executor": "ray", "ray_num_cpus": 0}, "'ray_num_cpus'"),
        ({"executor": "ray", "pipeline": "yes"}, "'pipeline'"),
        ({"executor": "ray", "max_branches": 0}, "'max_branches'"),
        ({"executor": "ray", "ray_address": ""}, "'ray_address'"),
        ({"executor": "ray", "ray_resources": {"drafter": 0}}, "'ray_resources'"),
        ({"executor": "ray", "ray_resources": {}}, "'ray_resources'"),
        ({"executor": "ray", "ray_resources": ["drafter"]}, "'ray_resources'"),
        ({"ray_resources": {"drafter": 1}}, "'ray_resources'"),  # a Ray-only key without the Ray executor
        ({"executor": "ray", "min_speculative_tokens": 5}, "'min_speculative_tokens'"),
        ({"draft_kv_pool_mb": 0}, "'draft_kv_pool_mb'"),
        ({"draft_kv_pool_mb": "big"}, "'draft_kv_pool_mb'"),
        ({"draft_cuda_graphs": True}, "'draft_cuda_graphs'"),
        ({"draft_cuda_graphs": []}, "'draft_cuda_graphs'"),
        ({"draft_cuda_graphs": [8, 0]}, "'draft_cuda_graphs'"),
        ({"num_speculative_tokens_per_batch_size": [[2, 8, 1]]}, "'num_speculative_tokens_per_batch_size'"),
        ({"num_speculative_tokens_per_batch_size": [[1, 8]]}, "'num_speculative_tokens_per_batch_size'"),
        ({"num_speculative_tokens_per_batch_size": [[1, 8, 2], [4, 16, 0]]}, "'num_speculative_tokens_per_batch_size'"),
        ({"num_speculative_tokens_per_batch_size": []}, "'num_speculative_tokens_per_batch_size'"),
        ({"sampled_speculative_tokens": 5}, "'sampled_speculative_tokens'"),
        ({"sampled_speculative_tokens": -1}, "'sampled_speculative_tokens'"),
    ],
)
def test_bad_config_names_key(gemma: str, smollm2: str, override: dict, key: str) -> None:
    spec = {"method": "hetero", "model": smollm2, "num_speculative_tokens": 4, "algorithm": "slem", **override}
    with pytest.raises(HeteroConfigError) as err:
        _engine_config(gemma, spec)
    assert key in str(err.value)


def test_every_other_rejection_sampling_method_is_refused(gemma: str, smollm2: str) -> None:
    """vLLM's ``rejection_sample_method`` (0.32.0: synthetic, block; 0.33.0 adds FLy, which
    is lossy) would do nothing under our verification: each value the installed vLLM
    knows, but the standard one, is refused at start-up naming the key."""
    import typing

    from vllm.config.speculative import RejectionSampleMethod

    methods = [m for m in typing.get_args(RejectionSampleMethod) if m != "standard"]
    assert {"synthetic", "block"} <= set(methods)
    for method in methods:
        spec = {"method": "hetero", "model": smollm2, "num_speculative_tokens": 4, "rejection_sample_method": method}
        with pytest.raises(HeteroConfigError, match=f"^'rejection_sample_method' = '{method}'"):
            _engine_config(gemma, spec)


def test_ray_settings_travel_to_the_workers(gemma: str, smollm2: str) -> None:
    spec = {"method": "hetero", "model": smollm2, "num_speculative_tokens": 4, "executor": "ray", "ray_num_cpus": 2}
    settings = _engine_config(gemma, spec).additional_config["hetero_spec"]
    assert settings["executor"] == "ray" and settings["draft_budget"] == "adaptive"
    assert (settings["ray_num_cpus"], settings["ray_threads"], settings["max_branches"]) == (2, 2, 4)


def test_draft_architecture_vllm_cannot_run(gemma: str, smollm2: str, tmp_path) -> None:
    """The drafter is built by vLLM's loader: an architecture vLLM lacks is refused at
    start-up, naming the key, not as a traceback from a worker."""
    config = json.loads((Path(smollm2) / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "architectures": ["NoSuchForCausalLM"]}))
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(Path(smollm2) / name, tmp_path / name)
    spec = {"method": "hetero", "model": str(tmp_path), "num_speculative_tokens": 4}
    with pytest.raises(HeteroConfigError, match="'model'.*NoSuchForCausalLM.*vLLM cannot run"):
        _engine_config(gemma, spec)


def test_unreadable_draft_model(gemma: str, tmp_path) -> None:
    (tmp_path / "config.json").write_text("{not json")
    spec = {"method": "hetero", "model": str(tmp_path), "num_speculative_tokens": 4}
    with pytest.raises(HeteroConfigError, match="'model'"):
        _engine_config(gemma, spec)


def test_auto_takes_tli_alone_where_the_vocabularies_agree_id_for_id(gemma: str, smollm2: str) -> None:
    """Over one vocabulary tli drafts the drafter's own tokens with its exact q; auto
    keeps the string-level rules out unless the config lists them."""
    spec = {"method": "hetero", "model": smollm2, "num_speculative_tokens": 4}
    def candidates(target: str, **extra) -> tuple[list[str], list[str]]:
        settings = _engine_config(target, {**spec, **extra}).additional_config["hetero_spec"]
        return list(settings["auto_greedy"]), list(settings["auto_sampled"])

    assert candidates(smollm2) == (["tli"], ["tli"])
    assert candidates(smollm2, auto_greedy=["slem", "tli"]) == (["slem", "tli"], ["tli"])
    assert candidates(smollm2, id_map="off") == candidates(gemma) == (["slem", "tli"], ["tli", "slrs"])


def test_unknown_key_rejected(gemma: str, smollm2: str) -> None:
    spec = {"method": "hetero", "model": smollm2, "num_speculative_tokens": 4, "algoritm": "tli"}
    with pytest.raises(Exception, match="algoritm"):
        _engine_config(gemma, spec)


def test_good_config_from_file_becomes_custom_class(gemma: str, smollm2: str, tmp_path) -> None:
    path = tmp_path / "hetero.json"
    path.write_text(json.dumps({"method": "hetero", "model": smollm2, "num_speculative_tokens": 3, "algorithm": "tli"}))
    cfg = _engine_config(gemma, str(path))
    assert cfg.speculative_config.method == "custom_class"
    assert cfg.speculative_config.num_speculative_tokens == 3
    assert cfg.additional_config["hetero_spec"]["algorithm"] == "tli"


def test_a_batch_size_schedule_reaches_vllm(gemma: str, smollm2: str) -> None:
    """vLLM's own key stays vLLM's: its scheduler reads it (the plugin caps each step by
    the k it picks, tests/e2e/test_batch_schedule.py)."""
    cfg = _engine_config(gemma, {"method": "hetero", "model": smollm2, "num_speculative_tokens": 3,
                                 "num_speculative_tokens_per_batch_size": [[1, 4, 3], [5, 64, 0]]})
    assert [list(r) for r in cfg.speculative_config.num_speculative_tokens_per_batch_size] == [[1, 4, 3], [5, 64, 0]]


def test_vllm_own_methods_untouched(gemma: str) -> None:
    cfg = _engine_config(gemma, {"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 3})
    assert cfg.speculative_config.method == "ngram"
    assert "hetero_spec" not in (cfg.additional_config or {})
