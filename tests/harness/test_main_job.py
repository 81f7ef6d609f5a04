"""The main job's bookkeeping (``python -m hetero_harness``, ``scripts/run.sh``): the
order of its engine processes, the per-round speedups, their median and spread, the
busy-machine warning, and what it prints and writes. The engines are stand-ins here
(``run_child`` faked); the job itself starts real ones."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time

import pytest

from hetero_harness import main_job


@pytest.mark.parametrize("rounds", [1, 2, 3, 4, 5])
def test_schedule_alternates_and_shares_processes(rounds: int) -> None:
    blocks = main_job.schedule(rounds)
    order = [(name, r) for name, rs in blocks for r in rs]
    # Every round once per engine; each round starts with the other engine than the last.
    assert sorted(order) == sorted((name, r) for r in range(rounds) for name in main_job.ENGINES)
    firsts = [next(name for name, rr in order if rr == r) for r in range(rounds)]
    assert firsts == ["plain" if r % 2 == 0 else "hetero" for r in range(rounds)]
    # Passes of one engine that follow each other share its process: rounds + 1 start-ups.
    assert all(a[0] != b[0] for a, b in zip(blocks, blocks[1:]))
    assert len(blocks) == rounds + 1


def _pass(tps: float, tokens: list[list[int]], others: float = 0.0, accepted: int = 0, drafts: int = 0) -> dict:
    return {"elapsed_s": 100.0 / tps, "output_tokens": 100, "tok_per_s": tps, "other_cpu_cores": others,
            "token_ids": tokens, "texts": ["some text"] * len(tokens),
            "num_drafts": drafts, "num_draft_tokens": 4 * drafts, "num_accepted_tokens": accepted,
            "acceptance_rate": accepted / (4 * drafts) if drafts else None,
            "mean_acceptance_length": 1 + accepted / drafts if drafts else None}


def _probe(steps: int, k3: int, slem: int) -> dict:
    return {"draft_dtype": "float32", "drafter_raw": {"steps": steps, "bridge_s": steps * 1e-3, "draft_s": steps * 0.05,
                                                      "fallbacks": 0},
            "draft_lengths": {"3": k3}, "rules_chosen": {"slem": slem}, "rule_rates": {"greedy": {"slem": 5.0}}}


def _run(monkeypatch, capsys, tmp_path, plain: list[float], hetero: list[float], others: float = 0.0,
         extra: tuple[str, ...] = ()) -> tuple[str, dict, list]:
    """main() with stand-in engines of the given tok/s per round; returns its output,
    its JSON and the fake children's (name, rounds) in order."""
    calls: list[tuple[str, list[int]]] = []
    ref = [[1, 2, 3], [4, 5]]

    def fake_child(job: dict) -> dict:
        name, rounds = job["name"], job["rounds"]
        calls.append((name, rounds))
        assert ("speculative_config" in job) == (name == "hetero")
        assert len(job["prompts"]) == 2 and job["n_rounds"] == len(plain)
        passes = {}
        for r in rounds:
            if name == "plain":
                passes[str(r)] = _pass(plain[r], ref, others)
            else:  # round 0's second prompt differs from plain decoding's
                passes[str(r)] = _pass(hetero[r], [ref[0], [4, 6]] if r == 0 else ref, others, accepted=30, drafts=20)
        n = len(calls)
        return {"start_s": 60.0 + n, "passes": passes, "probe_before": _probe(10 * n, 1, 1),
                "probe_after": _probe(10 * n + 40, 21, 11)}

    monkeypatch.setattr(main_job, "run_child", fake_child)
    monkeypatch.setattr("hetero_harness.models.ensure_model", lambda name: f"/models/{name}")
    monkeypatch.setattr("hetero_harness.prompts.chat_prompts", lambda target, qs: list(qs))
    out_json = tmp_path / "main.json"
    monkeypatch.setattr(sys, "argv", ["hetero_harness", "--num-prompts", "2", "--rounds", str(len(plain)),
                                      "--json", str(out_json), *extra])
    main_job.main()
    return capsys.readouterr().out, json.loads(out_json.read_text()), calls


def test_prints_each_round_the_median_and_the_spread(monkeypatch, capsys, tmp_path) -> None:
    out, data, calls = _run(monkeypatch, capsys, tmp_path, plain=[10.0, 10.0, 10.0], hetero=[12.0, 11.0, 12.5])
    assert calls == [("plain", [0]), ("hetero", [0, 1]), ("plain", [1, 2]), ("hetero", [2])]
    s = data["summary"]
    assert s["speedups"] == pytest.approx([1.2, 1.1, 1.25])
    assert (s["speedup"], s["speedup_min"], s["speedup_max"]) == pytest.approx((1.2, 1.1, 1.25))
    assert [row["first"] for row in s["rounds"]] == ["plain", "hetero", "plain"]
    assert [row["identical_outputs"] for row in s["rounds"]] == [1, 2, 2]
    assert s["identical_outputs"] == "5/6"
    assert s["acceptance_rate"] == pytest.approx(30 / 80) and s["mean_acceptance_length"] == pytest.approx(2.5)
    # The drafter's figures over the timed passes of both hetero processes only.
    assert s["draft_lengths"] == {"3": 40} and s["rules_chosen"] == {"slem": 20}
    assert s["draft_ms_per_step"] == pytest.approx(50.0)
    assert s["busy_machine"] == [] and "WARNING" not in out
    assert [name for name, _ in s["engine_start_s"]] == ["plain", "hetero", "plain", "hetero"]

    lines = [line for line in out.splitlines() if line.startswith("[hetero] ")]
    assert any(re.fullmatch(r"\[hetero\] round 2/3 done: plain 10\.00 tok/s, hetero 11\.00 tok/s, speedup 1\.10x, "
                            r"identical outputs 2/2", line) for line in lines), out
    table = [line for line in lines if re.match(r"\[hetero\] +\d +(plain|hetero) ", line)]
    assert len(table) == 3 and "1.25x" in table[2] and table[1].split()[2] == "hetero"
    assert "[hetero] speedup 1.20x (median of 3 rounds; min-max 1.10-1.25x; per round 1.20x, 1.10x, 1.25x)" in lines
    assert "[hetero] plain decoding: 10.00 tok/s (median)" in lines
    assert any(line.startswith("[hetero] acceptance rate 37.5%  mean acceptance length 2.50") for line in lines)
    assert "[hetero] identical to plain decoding: 5/6 prompt runs (2 prompts x 3 rounds)" in lines


def test_rounds_that_disagree_or_a_busy_cpu_are_flagged(monkeypatch, capsys, tmp_path) -> None:
    out, data, _ = _run(monkeypatch, capsys, tmp_path, plain=[10.0, 5.0], hetero=[12.0, 12.0])
    assert data["summary"]["speedup"] == pytest.approx(1.8)  # median of 1.2 and 2.4
    assert "[hetero] WARNING: the machine looks busy: the rounds' speedups differ by a factor of 2.00" in out

    out, data, _ = _run(monkeypatch, capsys, tmp_path, plain=[10.0, 10.0], hetero=[12.0, 12.0], others=0.9)
    assert data["summary"]["other_cpu_cores_max"] == pytest.approx(0.9)
    assert "other processes kept 0.90 cores busy during a timed pass" in out


def test_one_round_says_it_has_no_spread(monkeypatch, capsys, tmp_path) -> None:
    out, data, calls = _run(monkeypatch, capsys, tmp_path, plain=[10.0], hetero=[12.0])
    assert calls == [("plain", [0]), ("hetero", [0])]
    assert "one round: no spread" in out and len(data["summary"]["rounds"]) == 1


def test_cpu_watch_counts_other_processes_only() -> None:
    """A process outside this tree that spins shows up as other processes' CPU use."""
    spin = "import time\nt = time.time()\nwhile time.time() - t < 3: pass\n"
    # Started through a shell that exits at once: the spinner is no descendant of ours.
    subprocess.run(["sh", "-c", f"{sys.executable} -c '{spin}' >/dev/null 2>&1 &"], check=True)
    time.sleep(0.3)
    watch = main_job.CpuWatch()
    watch.start()
    time.sleep(1.5)
    others = watch.stop()
    assert others is not None and others > 0.3, others
