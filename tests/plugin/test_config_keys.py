"""Each config key is declared once (``config.HeteroSettings``); parsing, errors and the
docs table all come from that declaration. Parsing has no side effects."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest

from vllm_hetero_spec import config
from vllm_hetero_spec.config import FIELDS, HETERO_KEYS, HeteroConfigError, key_of, keys_table, parse_settings

DOCS = Path(__file__).parents[2] / "docs" / "configuration.md"


def test_docs_table_is_the_declarations() -> None:
    text = DOCS.read_text()
    table = re.search(r"<!-- keys:begin -->\n(.*?)<!-- keys:end -->", text, re.S)
    assert table is not None, "docs/configuration.md lost its key table markers"
    assert table.group(1) == keys_table(), "regenerate the table: see docs/configuration.md"


def test_every_key_is_declared_whole() -> None:
    assert len(set(HETERO_KEYS)) == len(HETERO_KEYS)
    for f in FIELDS:
        meta = f.metadata
        assert meta["help"] and meta["check"].text, key_of(f)
        default_given = f.default is not None or meta["default_text"] or meta["required"]
        assert default_given or key_of(f) == "ray_address", f"{key_of(f)}: no default and not required"
        if f.default is not None:
            assert meta["check"].test(f.default), f"{key_of(f)}: its default fails its own check"


def test_defaults_fill_in(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    settings, vllm_spec = parse_settings({"method": "hetero", "model": str(tmp_path), "num_speculative_tokens": 3,
                                          "max_model_len": 512})
    assert settings.draft_tokenizer == settings.draft_model == str(tmp_path)
    assert settings.max_draft_tokens == 3 and settings.draft_budget == "adaptive"
    # vLLM ignores a custom_class's draft-model keys: the drafter takes its own length.
    assert vllm_spec == {"method": "custom_class", "model": config.PROPOSER_CLASS, "num_speculative_tokens": 3}
    assert settings.max_model_len == 512
    assert dataclasses.asdict(settings) == settings.to_dict()


def test_a_short_model_name_resolves_to_what_set_up_built(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The plugin installs nothing: a short name is the folder set-up built for it, and a
    name set-up has not built is a config error naming the command that builds it."""
    from vllm_hetero_spec.model_store import READY_MARKER

    monkeypatch.setenv("VLLM_HETERO_SPEC_CACHE", str(tmp_path / "cache"))
    spec = {"method": "hetero", "model": "qwen2.5-coder-1.5b", "num_speculative_tokens": 2}
    config._parse.cache_clear()
    with pytest.raises(config.HeteroConfigError, match=r"bash scripts/setup.sh qwen2.5-coder-1.5b"):
        parse_settings(spec)
    assert not (tmp_path / "cache").exists()
    folder = tmp_path / "cache" / "models" / "qwen2.5-coder-1.5b"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    config._parse.cache_clear()
    with pytest.raises(config.HeteroConfigError):  # half built: no marker yet
        parse_settings(spec)
    (folder / READY_MARKER).write_text("sha\n")
    config._parse.cache_clear()
    settings, _ = parse_settings(spec)
    assert settings.draft_model == settings.draft_tokenizer == str(folder)


def test_parsed_once_per_spec(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    spec = {"method": "hetero", "model": str(tmp_path), "num_speculative_tokens": 2, "algorithm": "tli"}
    config._parse.cache_clear()
    first, _ = parse_settings(spec)
    second, _ = parse_settings(json.loads(json.dumps(spec)))
    assert first == second and config._parse.cache_info().hits == 1


@pytest.mark.parametrize("key,value,words", [
    ("lookbehind", -1, "an integer >= 0"),
    ("draft_stop_prob", 1.0, "a number in [0, 1)"),
    ("pipeline", True, "only applies with 'executor': 'ray'"),
    ("algorithm", "magic", "choose one of"),
    ("min_speculative_tokens", 3, "exceeds 'num_speculative_tokens'"),
])
def test_errors_name_the_key_and_the_fix(tmp_path: Path, key: str, value, words: str) -> None:
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(HeteroConfigError) as err:
        parse_settings({"method": "hetero", "model": str(tmp_path), "num_speculative_tokens": 2, key: value})
    assert f"'{key}'" in str(err.value) and words in str(err.value)
