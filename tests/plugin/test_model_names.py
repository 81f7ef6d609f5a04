"""A model name means the same model to the config and to ``advise`` (one order:
a folder as given, else the model set-up built under that short name), and the short
names the plugin lists are the ones set-up can build."""

from __future__ import annotations

from pathlib import Path

import pytest

from vllm_hetero_spec.advise.cli import resolve_model
from vllm_hetero_spec.config import parse_settings
from vllm_hetero_spec.model_store import SHORT_NAMES, resolve


def test_the_short_names_are_set_ups() -> None:
    from hetero_harness.models import MODELS

    assert set(SHORT_NAMES) == set(MODELS)


def test_a_folder_wins_over_a_short_name_in_the_config_and_in_advise(smollm2: str, tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    name = "smollm2-135m"
    assert resolve(name) == Path(smollm2)  # set-up's model, named short
    drafter = resolve_model("--drafters", name)
    assert drafter.folder == Path(smollm2).resolve() and drafter.config_name == name
    local = tmp_path / name  # a folder of the same name where the user works
    local.mkdir()
    (local / "config.json").write_text("{}")
    monkeypatch.chdir(tmp_path)
    assert resolve(name) == Path(name)
    drafter = resolve_model("--drafters", name)
    # A config written for it names the folder absolutely: a relative name breaks elsewhere.
    assert drafter.folder == local.resolve() and drafter.config_name == str(local.resolve())
    settings, _ = parse_settings({"method": "hetero", "model": name, "num_speculative_tokens": 7})  # parses are cached
    assert Path(settings.draft_model).resolve() == local.resolve()
