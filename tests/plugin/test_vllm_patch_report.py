"""``scripts/vllm_patch_report.py`` offline: its target list (parsed from the patches in
``vllm_integration/`` and the plugin's vLLM imports) and its tree comparison, on the
installed vLLM against itself and against copies with a patched function's body changed
and a module deleted. No download, no vLLM import (the script reads sources with ``ast``)."""

from __future__ import annotations

import ast
import importlib.util
import shutil
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _load_script():
    spec = importlib.util.spec_from_file_location("vllm_patch_report", ROOT / "scripts" / "vllm_patch_report.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


report = _load_script()

CHANGED = ("vllm.v1.sample.rejection_sampler", "expand_batch_to_tokens")  # a patched module function
DELETED_MODULE = "vllm/v1/engine/input_processor.py"  # holds InputProcessor._validate_params (patched)
DELETED_TARGET = ("vllm.v1.engine.input_processor", "InputProcessor._validate_params")


@pytest.fixture(scope="module")
def installed():
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("vllm is not installed")
    return report.SourceTree(next(iter(spec.submodule_search_locations)))


@pytest.fixture(scope="module")
def targets(installed):
    # The patches of the installed release (the trees compared here are all copies of it).
    return report.all_targets(installed, report.static_patch_targets(tree=installed,
                                                                     versions=[report.installed_vllm()[1]]))


@pytest.fixture(scope="module")
def itself(installed, targets):
    """The installed tree against a second reading of itself (fills ``files_used``)."""
    return report.compare_trees(installed, report.SourceTree(installed.root), targets)


@pytest.fixture(scope="module")
def altered(tmp_path_factory, installed, itself) -> Path:
    """A copy of the files the comparison uses, with ``expand_batch_to_tokens`` given one
    more statement and ``input_processor.py`` deleted."""
    root = tmp_path_factory.mktemp("vllm_copy")
    for relpath in installed.files_used | {"vllm/__init__.py"}:
        source = installed.root.parent / relpath
        (root / relpath).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, root / relpath)
    path = root / "vllm/v1/sample/rejection_sampler.py"
    text = path.read_text()
    func = next(n for n in ast.parse(text).body if isinstance(n, ast.FunctionDef) and n.name == CHANGED[1])
    lines = text.splitlines(keepends=True)
    lines.insert(func.end_lineno, " " * func.body[0].col_offset + "unreachable_but_new = 1\n")
    path.write_text("".join(lines))
    (root / DELETED_MODULE).unlink()
    return root


def _by_key(results):
    return {(r.module, r.qualname): r for r in results}


def test_the_targets_cover_every_patch_and_what_the_plugin_reads(targets) -> None:
    keys = {t.key: t for t in targets}
    patches = [t for t in targets if t.kind == "patch"]
    assert len(patches) >= 16, patches
    for key in [
        CHANGED,
        ("vllm.v1.worker.gpu_model_runner", "GPUModelRunner.propose_draft_token_ids"),
        ("vllm.engine.arg_utils", "EngineArgs.add_cli_args"),
        # patched in a loop over two request classes
        ("vllm.entrypoints.openai.chat_completion.protocol", "ChatCompletionRequest.to_sampling_params"),
        ("vllm.entrypoints.openai.completion.protocol", "CompletionRequest.to_sampling_params"),
        ("torch._dynamo.aot_compile_types", "BundledAOTAutogradSerializableCallable.deserialize_compile_artifacts"),
    ]:
        assert keys[key].kind == "patch", key
    # a module attribute assigned, an import, a class attribute, a subclass's inherited method
    assert any("assigns parallel_state._TP" in u for u in keys[("vllm.distributed.parallel_state", "_TP")].uses)
    assert keys[("vllm.config", "CUDAGraphMode")].kind == "read"
    assert ("vllm.config", "CUDAGraphMode.NONE") in keys
    assert ("vllm.v1.sample.rejection_sampler", "RejectionSampler._get_logprobs_tensors") in keys
    assert ("vllm.v1.worker.gpu_model_runner", "GPUModelRunner._sample") in keys  # relied on
    # a patched attribute the plugin also reads stays one patch row
    assert keys[CHANGED].kind == "patch" and any("target_constraints" in u for u in keys[CHANGED].uses)


def test_the_installed_tree_against_itself_is_unchanged(itself) -> None:
    statuses = {(r.module, r.qualname): r.status for r in itself}
    assert {s for (module, _), s in statuses.items() if not module.startswith("vllm")} == {"external"}
    vllm = {k: s for k, s in statuses.items() if k[0].startswith("vllm")}
    assert set(vllm.values()) <= {"unchanged", "exists"}, {k: s for k, s in vllm.items() if s != "unchanged"}
    assert sum(s == "unchanged" for s in vllm.values()) >= 50


@pytest.mark.parametrize("as_zip", [False, True], ids=["directory", "wheel"])
def test_a_changed_body_and_a_deleted_module_are_reported(installed, targets, altered, tmp_path, as_zip) -> None:
    new = altered
    if as_zip:
        new = tmp_path / "vllm-9.9.9-py3-none-any.whl"
        with zipfile.ZipFile(new, "w") as wheel:
            for path in altered.rglob("*.py"):
                wheel.write(path, path.relative_to(altered).as_posix())
    results = _by_key(report.compare_trees(installed, new, targets, "old", "new"))

    changed = results[CHANGED]
    assert changed.status == "changed" and (changed.added, changed.removed) == (1, 0)
    assert "+    unreachable_but_new = 1" in changed.diff
    assert changed.diff[0].startswith("--- old/vllm/v1/sample/rejection_sampler.py::expand_batch_to_tokens")

    missing = results[DELETED_TARGET]
    assert missing.status == "missing" and "vllm.v1.engine.input_processor not found" in missing.note

    others = {k: r.status for k, r in results.items() if k not in (CHANGED, DELETED_TARGET)}
    assert set(others.values()) <= {"unchanged", "exists", "external"}, \
        {k: s for k, s in others.items() if s not in ("unchanged", "exists", "external")}


def test_the_report_lists_every_target_and_keeps_its_assessment(installed, targets, altered, tmp_path) -> None:
    results = report.compare_trees(installed, altered, targets, "old", "new")
    text = report.render_markdown(results, "0.32.0", "9.9.9", "Test trees.", "cmd")
    table = [line for line in text.splitlines() if line.startswith("| `")]
    assert len(table) == len(targets)
    assert "| `vllm.v1.sample.rejection_sampler` | `expand_batch_to_tokens` | patch | **changed** | +1 −0 |" in text
    assert "| `vllm.v1.engine.input_processor.InputProcessor` | `_validate_params` | patch | **missing** |" in text
    assert text.count("<details>") == 2 and "````diff" in text
    # A hand-written summary survives regeneration.
    out = tmp_path / "report.md"
    out.write_text(text.replace("*(Not yet assessed", "Upgrade notes by hand. *(Not yet assessed"))
    kept = report.kept_assessment(out)
    assert kept.startswith("Upgrade notes by hand.")
    assert "Upgrade notes by hand." in report.render_markdown(results, "0.32.0", "9.9.9", "", "cmd", kept)
