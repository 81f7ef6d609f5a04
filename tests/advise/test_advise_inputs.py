"""Bad input to ``advise`` fails before any engine starts, with one line naming the fix;
good input lays out the engines a user expects (the target alone, each drafter under
the plugin, and vLLM's ``draft_model`` for a drafter of the target's own vocabulary)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from vllm_hetero_spec.__main__ import main as entry
from vllm_hetero_spec.advise.cli import InputError, Model, check_fits, main, parameters, parser, plan
from vllm_hetero_spec.advise.prompts import SPEC_BENCH, categories, load_prompts, render, spec_bench_questions
from vllm_hetero_spec.advise.session import planned_calls

GIB = 1 << 30
ROOMY = (64 * GIB, "of memory available")


def _args(target: str, drafters: str, *extra: str):
    return parser().parse_args(["--target", target, "--drafters", drafters, *extra])


@pytest.mark.parametrize(("argv", "message"), [
    (["--drafters", "no-such-drafter"], "'--drafters' = 'no-such-drafter' was not found; tried a folder"),
    (["--drafters", " , "], "--drafters is empty"),
    (["--batch-sizes", "1,x"], "--batch-sizes '1,x': expected integers"),
    (["--batch-sizes", "0"], "expected integers >= 1"),
    (["--temperatures", "-1"], "expected numbers >= 0"),
    (["--batch-sizes", "1,16"], "--batch-sizes '1,16': batch 16 needs at least 16 prompts, and --prompts gives 13"),
    (["--drafters", "plain"], "--drafters 'plain': plain decoding is always measured"),
    (["--rules", "tli,fsd"], "--rules 'tli,fsd': fsd; choose among the lossless rules"),
    (["--k", "0"], "--k 0: must be at least 1"),
    (["--prompts", "/nonexistent.jsonl"], "no such file"),
])
def test_bad_arguments_are_named_with_their_fix(smollm2: str, gemma: str, argv: list[str], message: str,
                                                capsys: pytest.CaptureFixture) -> None:
    base = {"--drafters": smollm2}
    for flag, value in zip(argv[::2], argv[1::2]):
        base[flag] = value
    flat = [x for kv in base.items() for x in kv]
    assert main(["--target", gemma, *flat]) == 2
    err = capsys.readouterr().err
    assert err.startswith("advise: ") and message in err and err.count("\n") == 1, err


def test_an_unknown_target_and_an_empty_prompt_file(smollm2: str, tmp_path, capsys: pytest.CaptureFixture) -> None:
    assert main(["--target", "not-a-model", "--drafters", smollm2]) == 2
    assert "'--target' = 'not-a-model' was not found" in capsys.readouterr().err
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n\n")
    assert main(["--target", smollm2, "--drafters", smollm2, "--prompts", str(empty)]) == 2
    assert "holds no prompts" in capsys.readouterr().err
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "fine"}\n{"text": "no prompt key"}\n')
    with pytest.raises(ValueError, match="line 2: expected an object"):
        load_prompts(str(bad), 8)


def test_a_target_that_does_not_fit_is_refused(qwen05: str, smollm2: str) -> None:
    target, drafter = Model("qwen", Path(qwen05), qwen05), Model("smol", Path(smollm2), smollm2)
    assert 4.9e8 < parameters(target.folder) < 6.4e8  # the converted checkpoint stores the tied head apart
    with pytest.raises(InputError, match=r"--target qwen: its weights take 2\.3 GiB as float32 .* but only 1\.0 GiB"):
        check_fits(target, [drafter], "float32", (GIB, "of memory available"))
    check_fits(target, [drafter], "float32", ROOMY)
    with pytest.raises(InputError, match="only 1.0 GiB"):
        plan(_args(qwen05, smollm2, "--dtype", "float32"), available=(GIB, "of memory available"))


def test_the_command_line_entry(capsys: pytest.CaptureFixture) -> None:
    assert entry([]) == 2 and "usage: python -m vllm_hetero_spec advise [-h] --target TARGET" in capsys.readouterr().err


def test_good_input_lays_out_the_engines(qwen05: str, smollm2: str, gemma: str, tmp_path) -> None:
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"prompt": "def f(x):"}) + "\n"
                       + json.dumps({"messages": [{"role": "user", "content": "Hi"}]}) + "\n")
    p = plan(_args(qwen05, f"{smollm2},{gemma},{qwen05},{smollm2}", "--prompts", str(prompts), "--batch-sizes", "2,1",
                   "--temperatures", "1,0", "--k", "3", "--dtype", "float32"), available=ROOMY)
    assert [(label.split("/")[-1], job["kind"]) for label, _, job in p.jobs] == [
        ("plain", "plain"), (smollm2.split("/")[-1], "hetero"), (gemma.split("/")[-1], "hetero"),
        (qwen05.split("/")[-1], "hetero"), (qwen05.split("/")[-1] + " (vLLM draft_model)", "draft_model")]
    job = p.jobs[1][2]
    assert job["batch_sizes"] == [1, 2] and job["temperatures"] == [0.0, 1.0] and job["sweep_ks"] == [0, 1, 2, 3]
    assert job["rules"] == {"0.0": ["slem", "tli"], "1.0": ["tli", "slrs"]}  # auto's defaults per kind
    # ...and for a drafter that agrees with the target id for id, what auto takes there: tli.
    assert p.jobs[3][2]["rules"] == {"0.0": ["tli"], "1.0": ["tli"]}
    assert len(job["prompts"]) == 2 and isinstance(job["prompts"][1], list)
    assert planned_calls(job) == 2 * 4 + 4 * 2 and planned_calls(p.jobs[0][2]) == 8
    assert p.dtype == "float32" and all(j["dtype"] == p.dtype for _, _, j in p.jobs)  # recorded with the result
    assert not any(j["enforce_eager"] for _, _, j in p.jobs)  # vLLM's default: compiled
    eager = plan(_args(qwen05, smollm2, "--prompts", str(prompts), "--batch-sizes", "1", "--dtype", "float32",
                       "--enforce-eager"), available=ROOMY)
    assert all(j["enforce_eager"] for _, _, j in eager.jobs)  # every engine, the plain one too
    from vllm_hetero_spec.vocab.bridge import load_tokenizer

    rendered = render(job["prompts"], load_tokenizer(qwen05))
    assert rendered[0] == "def f(x):" and "Hi" in rendered[1] and rendered[1] != "Hi"  # the chat template


def test_the_built_in_prompt_set_mixes_categories() -> None:
    prompts = load_prompts("spec-bench", 10)
    assert len(prompts) == 10 and len({p[0]["content"] for p in prompts}) == 10


def test_a_default_sample_and_a_later_round_hold_the_same_mix_and_no_prompt_in_common() -> None:
    category = {}
    with open(SPEC_BENCH) as f:
        for line in f:
            row = json.loads(line)
            category[row["turns"][0]] = row["category"]
    sample = [p[0]["content"] for p in load_prompts("spec-bench", parser().parse_args(
        ["--target", "t", "--drafters", "d"]).num_prompts)]
    held_out = spec_bench_questions(len(sample), first_round=1)
    assert len(sample) == categories() == 13 and not set(sample) & set(held_out)
    assert sorted(category[q] for q in sample) == sorted(category[q] for q in held_out) == sorted(set(category.values()))
