"""One engine's short measured runs, in a process of its own (``advise`` starts one per
engine, one at a time, so that a large target's memory is freed between them):

    python -m vllm_hetero_spec.advise.session JOB.json RESULT.json

``job["kind"]`` picks what runs:

- ``plain``: the target alone. Per temperature and batch size, the sample's wall time
  with ``max_tokens`` and with 1 token (its prefill and first token), for the share of a
  run that no drafter shortens.
- ``hetero``: the target with our proposer (``algorithm: auto`` over the rules measured,
  each pinned in turn through :mod:`~vllm_hetero_spec.advise.probe`). First a sweep: per
  batch size, a few steps at each draft length (the target's step against the tokens
  it verifies, and the drafting's cost against k); then per temperature, rule and batch
  size the whole sample at the longest length, for acceptance per position.
- ``draft_model``: vLLM's own draft-model speculation, the same drafter (same
  vocabulary only): per temperature and batch size, the sample's wall time and
  acceptance.
- ``config``: a speculative config as written (``job["config"]``: the one ``advise``
  recommends, checked on other prompts), measured like ``draft_model``.

A job with ``pins`` (``{"T", "b"}`` each, and for ``hetero`` ``"rule"`` and ``"k"``;
``"max_tokens"`` where it differs from the job's; ``"prompts"``: the first that many
prompts only; ``"round"`` is carried to the result)
runs just those settings, no sweep: how a projection is checked on prompts ``advise``
did not see, at the output lengths it projected for. A job with ``served`` (prompts that
are not the measured ones) serves them first, untimed: a running server's engine, not a
fresh one, is what users meet.

Progress goes to stdout as ``ADVISE-PROGRESS <done> <total>`` lines, which the parent
turns into a progress bar; everything else (vLLM's logs) into its log file.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

from vllm_hetero_spec.advise.counters import spec_decode_delta
from vllm_hetero_spec.advise.probe import PROBE
from vllm_hetero_spec.advise.prompts import render

PROGRESS = "ADVISE-PROGRESS"
WARMUP_TOKENS = 4


def base_job(target: str, prompts: list, *, dtype: str, max_model_len: int, seed: int, max_tokens: int, k: int,
             batch_sizes: list[int], temperatures: list[float], enforce_eager: bool = False) -> dict[str, Any]:
    """What every job carries, whatever its kind (the caller adds ``kind`` and the keys
    of that kind). ``enforce_eager``: measure the engines as a server started with
    ``--enforce-eager`` runs (step costs differ from compiled ones, so advice for one
    does not carry to the other)."""
    return {"target": target, "prompts": prompts, "dtype": dtype, "max_model_len": max_model_len, "seed": seed,
            "max_tokens": max_tokens, "k": k, "batch_sizes": batch_sizes, "temperatures": temperatures,
            "enforce_eager": enforce_eager}


def speculative_config(job: dict[str, Any]) -> dict[str, Any] | None:
    """The engine's ``speculative_config`` for ``job``."""
    if job["kind"] == "plain":
        return None
    if job["kind"] == "config":
        return job["config"]
    if job["kind"] == "draft_model":
        return {"method": "draft_model", "model": job["drafter"], "num_speculative_tokens": job["k"]}
    rules = sorted({r for rs in job["rules"].values() for r in rs})
    return {"method": "hetero", "model": job["drafter"], "num_speculative_tokens": job["k"], "algorithm": "auto",
            "auto_greedy": rules, "auto_sampled": rules}


def planned_calls(job: dict[str, Any]) -> int:
    """The generate passes ``job`` times (the progress bar's length)."""
    temps, sizes = job["temperatures"], job["batch_sizes"]
    per_run = 2 if job["kind"] == "plain" and job.get("first_token", True) else 1
    if job.get("pins"):
        return per_run * len(job["pins"])
    if job["kind"] != "hetero":
        return per_run * len(temps) * len(sizes)
    return len(sizes) * len(job["sweep_ks"]) + sum(len(job["rules"][str(t)]) for t in temps) * len(sizes)


class Session:
    """One engine and the passes ``job`` asks of it."""

    def __init__(self, job: dict[str, Any]):
        from vllm.entrypoints.llm import LLM

        self.job = job
        self.hetero = job["kind"] == "hetero"
        self.llm = LLM(
            model=job["target"],
            dtype=job["dtype"],
            max_model_len=job["max_model_len"],
            max_num_seqs=max(job["batch_sizes"]),
            speculative_config=speculative_config(job),
            worker_extension_cls=PROBE if self.hetero else "",
            disable_log_stats=False,
            seed=job["seed"],
            enforce_eager=job.get("enforce_eager", False),
        )
        self.prompts = render(job["prompts"], self.llm.get_tokenizer())
        self.served = render(job.get("served", []), self.llm.get_tokenizer())
        self.total = planned_calls(job)
        self.done = 0

    def tick(self) -> None:
        self.done += 1
        print(f"{PROGRESS} {self.done} {self.total}", flush=True)

    def generate(self, indices: list[int], batch: int, temperature: float, max_tokens: int,
                 prompts: list[str] | None = None) -> tuple[float, list[int]]:
        """``indices``' prompts (of the sample, or of ``prompts``), ``batch`` at a time; the
        wall time and each output's length.
        Requests carry no seed: a seeded request is verified by equality with its own
        random stream, which accepts fewer drafts at T > 0 than the unseeded traffic
        advise projects for (the engine's seed keeps runs repeatable)."""
        from vllm.sampling_params import SamplingParams

        params = SamplingParams(temperature=temperature, max_tokens=max_tokens)
        source = self.prompts if prompts is None else prompts
        lengths: list[int] = []
        t0 = time.perf_counter()
        for s in range(0, len(indices), batch):
            chunk = indices[s:s + batch]
            outputs = self.llm.generate([source[i] for i in chunk], params, use_tqdm=False)
            lengths += [len(o.outputs[0].token_ids) for o in outputs]
        return time.perf_counter() - t0, lengths

    def pin(self, rule: str, k: int) -> None:
        self.llm.collective_rpc("advise_pin", args=(rule, k))

    def read(self) -> list[dict[str, Any]]:
        """The steps the proposer logged since the last read."""
        return self.llm.collective_rpc("advise_read")[0]

    def warm_up(self) -> None:
        """The first pass at a new shape is slow on a CPU (kernels built per shape): per
        batch size, one untimed pass drafting at the longest length, and every prompt's
        prefill (one token each). Without the prefills, an engine's first timed pass
        over the sample met each prompt's length for the first time and ran slower than
        the same pass repeated; that pass is always the first temperature at the
        smallest batch, whose speedups it skewed (docs/advise.md).

        Then the job's ``served`` prompts, one at a time per temperature, to its longest
        output: an engine's first requests also pay the adaptive budget's warm-up and
        first probes and ``auto``'s first comparisons, which a server pays once in its
        life, so a config that learns is measured as it runs once it has served."""
        everything = list(range(len(self.prompts)))
        for b in self.job["batch_sizes"]:
            if self.hetero:
                self.pin(self._first_rule(), self.job["k"])
            self.generate(list(range(b)), b, 0.0, WARMUP_TOKENS + self.job["k"])
            self.generate(everything, b, 0.0, 1)
        for t in self.job["temperatures"] if self.served else []:
            self.generate(list(range(len(self.served))), 1, t, self.job["max_tokens"], self.served)
        if self.hetero:
            self.read()

    def _first_rule(self) -> str:
        return self.job["rules"][str(self.job["temperatures"][0])][0]

    def measure(self, rule: str | None, t: float, b: int, k: int, max_tokens: int,
                prompts: int | None = None) -> dict[str, Any]:
        """The sample (its first ``prompts``, where given) at temperature ``t``, ``b``
        requests at a time, ``max_tokens`` each (ours: pinned to ``rule`` and ``k``): wall
        time, output lengths, and the engine's counters."""
        job, everything = self.job, list(range(len(self.prompts)))[:prompts]
        run: dict[str, Any] = {"T": t, "b": b, "rule": rule, "k": k, "max_tokens": max_tokens}
        if job["kind"] == "plain" and job.get("first_token", True):
            run["wall_first"], _ = self.generate(everything, b, t, 1)
            self.tick()
        if self.hetero:
            self.pin(rule, k)
        counted = job["kind"] != "plain"
        before = {m.name: m for m in self.llm.get_metrics()} if counted else {}
        run["wall"], run["lengths"] = self.generate(everything, b, t, max_tokens)
        if counted:
            run["counters"] = spec_decode_delta(before, self.llm.get_metrics())
        if self.hetero:
            run["steps"] = self.read()
        self.tick()
        return run

    def run(self) -> dict[str, Any]:
        self.warm_up()
        job = self.job
        out: dict[str, Any] = {"kind": job["kind"], "sweep": [], "runs": []}
        if job.get("pins"):
            out["runs"] = [{**self.measure(p.get("rule"), p["T"], p["b"], p.get("k", job["k"]),
                                           p.get("max_tokens", job["max_tokens"]), p.get("prompts")),
                            "round": p.get("round", 0)} for p in job["pins"]]
            return out
        if self.hetero:
            for b in job["batch_sizes"]:
                for k in job["sweep_ks"]:
                    self.pin(self._first_rule(), k)
                    self.generate(list(range(b)), b, 0.0, job["sweep_tokens"])
                    out["sweep"].append({"b": b, "k": k, "steps": self.read()})
                    self.tick()
        for t in job["temperatures"]:
            for rule in job["rules"][str(t)] if self.hetero else [None]:
                for b in job["batch_sizes"]:
                    out["runs"].append(self.measure(rule, t, b, job["k"], job["max_tokens"]))
        return out


def main(job_path: str, out_path: str) -> None:
    job = json.loads(Path(job_path).read_text())
    result = Session(job).run()
    Path(out_path).write_text(json.dumps(result))


if __name__ == "__main__":
    main(*sys.argv[1:3])
