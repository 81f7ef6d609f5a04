"""Per-request settings are refused in the front end with vLLM's 400-class error."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from vllm.exceptions import VLLMValidationError
from vllm.sampling_params import SamplingParams

from vllm_hetero_spec import vllm_integration
from vllm_hetero_spec.vllm_integration.request_validation import check_extra_args


@pytest.mark.parametrize("extra", [None, {}, {"fsd_threshold": 0}, {"fsd_threshold": 0.25}, {"someone_elses": 1},
                                   {"algorithm": "slrs"}, {"algorithm": "fsd"}])
def test_good_extra_args_pass(extra) -> None:
    check_extra_args(extra)


@pytest.mark.parametrize(
    "extra,needle",
    [
        ({"fsd_threshold": -1}, "finite number >= 0"),
        ({"fsd_threshold": float("nan")}, "finite number >= 0"),
        ({"fsd_threshold": float("inf")}, "finite number >= 0"),
        ({"fsd_threshold": "0.1"}, "finite number >= 0"),
        ({"fsd_threshold": True}, "finite number >= 0"),
        ({"fsd_treshold": 0.1}, "did you mean 'fsd_threshold'"),
        ({"algorithm": "sleme"}, "must name one of this engine's rules"),
        ({"algorithm": 3}, "must name one of this engine's rules"),
        ({"algorithm": "auto"}, "must name one of this engine's rules"),
        ({"algorithms": "slem"}, "did you mean 'algorithm'"),
    ],
)
def test_bad_extra_args_are_client_errors(extra, needle: str) -> None:
    with pytest.raises(VLLMValidationError, match=needle) as info:
        check_extra_args(extra)
    assert info.value.parameter.startswith("vllm_xargs.")


def test_offline_requests_are_checked_before_the_engine() -> None:
    """`LLM.generate` goes through InputProcessor._validate_params: the patch raises there,
    before vLLM's own checks (so a stand-in processor is enough to show it)."""
    from vllm.v1.engine.input_processor import InputProcessor

    vllm_integration.apply()
    params = SamplingParams(max_tokens=4, extra_args={"fsd_threshold": -0.5})
    plain = SimpleNamespace(vllm_config=SimpleNamespace(additional_config=None))
    with pytest.raises(VLLMValidationError, match="fsd_threshold"):
        InputProcessor._validate_params(plain, params, ("generate",))


def test_a_request_may_name_only_a_rule_its_engine_drafts_with() -> None:
    """A rule the engine offers passes on to vLLM's own checks (which the stand-in then
    fails on); one it lacks is refused naming the engine's rules."""
    from vllm.v1.engine.input_processor import InputProcessor

    from vllm_hetero_spec.config import ADDITIONAL_CONFIG_KEY, parse_settings

    vllm_integration.apply()
    settings, _ = parse_settings({"method": "hetero", "model": "smollm2-135m", "num_speculative_tokens": 2,
                                  "auto_greedy": ["slem"], "auto_sampled": ["tli"]})
    engine = SimpleNamespace(vllm_config=SimpleNamespace(additional_config={ADDITIONAL_CONFIG_KEY: settings.to_dict()}))
    with pytest.raises(VLLMValidationError, match=r"this engine's rules \['slem', 'tli'\], got 'union'") as info:
        InputProcessor._validate_params(engine, SamplingParams(extra_args={"algorithm": "union"}), ("generate",))
    assert info.value.parameter == "vllm_xargs.algorithm"
    with pytest.raises(AttributeError):  # past our check, into vLLM's, which the stand-in cannot answer
        InputProcessor._validate_params(engine, SamplingParams(extra_args={"algorithm": "tli"}), ("generate",))


def test_openai_requests_are_checked_when_params_are_built() -> None:
    from vllm.entrypoints.openai.completion.protocol import CompletionRequest

    vllm_integration.apply()
    request = CompletionRequest(model="m", prompt="hi", max_tokens=4, vllm_xargs={"fsd_threshold": -1})
    with pytest.raises(VLLMValidationError, match="fsd_threshold"):
        request.to_sampling_params(max_tokens=4, default_sampling_params={})
