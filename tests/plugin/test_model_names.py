"""A model name means the same model to the config and to ``advise`` (one order:
a folder as given, else the model set-up built under that short name), and the short
names the plugin lists are the ones set-up can build."""

from __future__ import annotations

from pathlib import Path

import pytest

from vllm_hetero_spec.advise.cli import resolve_model
from vllm_hetero_spec.config import HeteroConfigError, parse_settings
from vllm_hetero_spec.model_names import locate
from vllm_hetero_spec.model_store import SHORT_NAMES


def test_the_short_names_are_set_ups() -> None:
    from hetero_harness.models import MODELS

    assert set(SHORT_NAMES) == set(MODELS)


def test_a_folder_wins_over_a_short_name_in_the_config_and_in_advise(smollm2: str, tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    name = "smollm2-135m"
    assert locate(name) == Path(smollm2)  # set-up's model, named short
    drafter = resolve_model("--drafters", name)
    assert drafter.folder == Path(smollm2).resolve() and drafter.config_name == name
    local = tmp_path / name  # a folder of the same name where the user works
    local.mkdir()
    (local / "config.json").write_text("{}")
    monkeypatch.chdir(tmp_path)
    locate.cache_clear()
    assert locate(name) == Path(name)
    drafter = resolve_model("--drafters", name)
    # A config written for it names the folder absolutely: a relative name breaks elsewhere.
    assert drafter.folder == local.resolve() and drafter.config_name == str(local.resolve())
    settings, _ = parse_settings({"method": "hetero", "model": name, "num_speculative_tokens": 7})  # parses are cached
    assert Path(settings.draft_model).resolve() == local.resolve()


SMOL_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
QWEN_ID = "Qwen/Qwen2.5-Coder-0.5B-Instruct"


def _spec(**keys) -> dict:
    return {"method": "hetero", "model": SMOL_ID, "num_speculative_tokens": 4, **keys}


def test_a_hub_id_resolves_in_the_cache_and_travels_as_given(offline_hub: Path, smollm2: str) -> None:
    """A Hub id is what a vLLM user types: it parses, resolves in the Hugging Face cache
    (``HF_HUB_OFFLINE``: the cache alone), and the workers get the id, to resolve in their
    own cache, not this process's path."""
    from hetero_harness.hf_cache import commit_of
    from vllm_hetero_spec.model_names import draft_model_folder, draft_tokenizer_folder

    settings, _ = parse_settings(_spec(num_speculative_tokens=5))
    assert settings.draft_model == SMOL_ID
    folder = draft_model_folder(settings)
    assert folder.parent.name == "snapshots" and folder.name == commit_of(SMOL_ID, "main")
    assert (folder / "config.json").read_bytes() == (Path(smollm2) / "config.json").read_bytes()
    assert draft_tokenizer_folder(settings) == folder


def test_a_revision_picks_its_snapshot_for_the_config_and_for_vllms_loader(offline_hub: Path, smollm2: str) -> None:
    """``revision`` takes effect where the plugin reads files and where vLLM's loader
    reads the weights: the drafter's own vLLM config points at that revision's snapshot."""
    from hetero_harness.hf_cache import add_repo, commit_of
    from vllm_hetero_spec.drafter.runtime.config import resolve_runtime_config
    from vllm_hetero_spec.drafter.runtime.model import draft_vllm_config
    from vllm_hetero_spec.model_names import draft_model_folder

    add_repo(offline_hub / "hub", SMOL_ID, Path(smollm2), "v2", {"generation_config.json": "{}"})
    settings, _ = parse_settings(_spec(revision="v2"))
    assert draft_model_folder(settings).name == commit_of(SMOL_ID, "v2")
    cfg, _ = resolve_runtime_config(settings)
    assert cfg.load.revision == "v2"
    vllm_config = draft_vllm_config(cfg)
    assert Path(vllm_config.model_config.model).name == commit_of(SMOL_ID, "v2")
    assert vllm_config.model_config.revision == "v2"


def test_the_targets_tokenizer_revision_picks_the_tokenizer_the_bridge_reads(offline_hub: Path, qwen05: str) -> None:
    from types import SimpleNamespace

    from hetero_harness.hf_cache import add_repo, commit_of
    from vllm_hetero_spec.model_names import target_tokenizer_folder

    add_repo(offline_hub / "hub", QWEN_ID, Path(qwen05), "tok-v2")
    target = SimpleNamespace(tokenizer=QWEN_ID, tokenizer_revision="tok-v2")
    assert target_tokenizer_folder(target).name == commit_of(QWEN_ID, "tok-v2")
    assert target_tokenizer_folder(SimpleNamespace(tokenizer=QWEN_ID)).name == commit_of(QWEN_ID, "main")


def test_an_unknown_id_offline_gets_one_error_naming_what_was_tried(offline_hub: Path) -> None:
    with pytest.raises(HeteroConfigError) as err:
        parse_settings(_spec(model="nobody/no-such-model"))
    text = str(err.value)
    assert text.startswith("'model' = 'nobody/no-such-model' was not found")
    for tried in ("a folder", "a model set-up built", str(offline_hub / "hub"), "HF_HUB_OFFLINE is set", "Fix:"):
        assert tried in text, tried
    with pytest.raises(HeteroConfigError, match=r"'draft_tokenizer' = 'nobody/tok' was not found"):
        parse_settings(_spec(draft_tokenizer="nobody/tok"))
    with pytest.raises(HeteroConfigError, match=r"'model' = '/no/such/folder': no such folder"):
        parse_settings(_spec(model="/no/such/folder"))


def test_advise_takes_ids(offline_hub: Path) -> None:
    drafter = resolve_model("--drafters", SMOL_ID)
    assert drafter.config_name == SMOL_ID and (drafter.folder / "model.safetensors").is_file()
    from vllm_hetero_spec.advise.cli import InputError

    with pytest.raises(InputError, match=r"'--target' = 'nobody/x' was not found"):
        resolve_model("--target", "nobody/x")


def test_the_readmes_hub_commands_resolve_through_the_hub_cache(offline_hub: Path) -> None:
    """The README's commands for users with Hub access name models by id: those ids are
    the models set-up converts, and the config they paste resolves (through the Hub
    cache, as the e2e servers and engines named by id run)."""
    import json
    import re
    import shlex
    from types import SimpleNamespace

    from hetero_harness.hf_cache import UPSTREAM_IDS
    from vllm_hetero_spec.model_names import draft_model_folder, target_tokenizer_folder

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    block = re.search(r"^## Quick start\n.*?^```sh\n(.*?)^```", readme, re.M | re.S).group(1)
    serve = next(shlex.split(line) for line in block.splitlines() if line.startswith("vllm serve"))
    assert serve[2] in UPSTREAM_IDS.values()
    spec = json.loads(serve[serve.index("--speculative-config") + 1])
    assert spec["model"] in UPSTREAM_IDS.values()
    settings, _ = parse_settings(spec)
    assert (draft_model_folder(settings) / "config.json").is_file()
    target = SimpleNamespace(tokenizer=serve[2], tokenizer_revision=None)
    assert (target_tokenizer_folder(target) / "tokenizer.json").is_file()


def test_vllm_serve_with_an_unknown_id_offline_stops_at_its_arguments(hub_home: Path, qwen05: str) -> None:
    """``vllm serve`` (the real CLI) with a drafter id no cache holds and
    ``HF_HUB_OFFLINE=1``: a usage error naming the key, what was tried and the fix,
    before any engine starts; no traceback."""
    import json
    import subprocess

    from hetero_harness.evaluation import default_env
    from hetero_harness.hf_cache import offline_env
    from hetero_harness.server_process import vllm_command

    spec = {"method": "hetero", "model": "nobody/no-such-drafter", "num_speculative_tokens": 4}
    proc = subprocess.run([*vllm_command(), "serve", qwen05, "--speculative-config", json.dumps(spec)],
                          env={**default_env(), **offline_env(hub_home)}, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "error: argument --speculative-config/-sc: 'model' = 'nobody/no-such-drafter' was not found" in proc.stderr
    assert "HF_HUB_OFFLINE is set" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr[-3000:]
