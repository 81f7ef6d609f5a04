"""``python -m vllm_hetero_spec advise``: which drafter, which rule, what speedup.

Checks every input first (models, prompts, sizes, memory), so a bad one fails in a
second naming the fix. Then it starts one engine at a time, each in a process of its
own: the target alone, then the target with each drafter under our plugin, and, for a
drafter of the target's own vocabulary, under vLLM's ``draft_model`` too. Each runs a
sample of the prompts briefly (:mod:`~vllm_hetero_spec.advise.session`); the projection
(:mod:`~vllm_hetero_spec.advise.analysis`) and the outputs
(:mod:`~vllm_hetero_spec.advise.report`) follow. vLLM's own logs go to a file, so the
terminal shows a progress bar and the verdict.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import struct
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vllm_hetero_spec.advise.analysis import (
    OUTPUT_LENGTHS, AdviseError, ConfigNames, Option, Recommendation, draft_model_label, draft_model_options,
    hetero_options, recommend)
from vllm_hetero_spec.advise.prompts import BUILT_IN, PromptError, load_prompts
from vllm_hetero_spec.advise.report import plot, table, verdict, write_json
from vllm_hetero_spec.advise.session import PROGRESS, base_job, planned_calls
from vllm_hetero_spec.config import LOSSLESS_RULES, HeteroSettings
from vllm_hetero_spec.model_names import ModelNotFound, locate

DEFAULT_LENGTHS = ",".join(map(str, OUTPUT_LENGTHS))
#: Bytes per weight by dtype name (the engine's, not the checkpoint's).
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "auto": 2}
#: The KV cache an engine gets on a CPU where the user set none: vLLM's CPU backend
#: otherwise reserves a share of the machine's memory (``gpu_memory_utilization``) that
#: a machine with anything else running refuses at start-up.
CPU_KV_GIB = "2"
#: Generic lines vLLM logs after the one that names a failed engine's cause.
_GENERIC = ("Engine core initialization failed", "WorkerProc initialization failed")
#: Room beyond the weights an engine needs (activations, the runtime, its KV cache's floor).
FIT_MARGIN = 1.3


class InputError(ValueError):
    """A bad argument, named with its fix."""


@dataclass(frozen=True)
class Model:
    """A model as the user named it, the folder it resolved to, and how a config written
    for it names it: the short name where set-up's model is what it resolved to, else
    the absolute folder (a relative one breaks once the config is used elsewhere)."""

    name: str
    folder: Path
    config_name: str


def resolve_model(flag: str, name: str) -> Model:
    """A model named as vLLM names it (``model_names.locate``: a folder, a short name
    set-up has built, or a Hub id, downloaded with its safetensors on first use, whose
    headers :func:`parameters` reads). A config written for it names it as the user did
    where that name is portable (a short name, an id), else by its absolute folder."""
    try:
        found = locate(name, key=flag, weights=True)
    except ModelNotFound as err:
        raise InputError(str(err)) from None
    folder = found.resolve()
    local = Path(name).expanduser().is_dir()
    return Model(name, folder, str(folder) if local else name)


def parameters(folder: Path) -> int:
    """The model's parameter count, from its safetensors headers (no weights read)."""
    total = 0
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise InputError(f"{folder}: no .safetensors weights found; advise reads safetensors checkpoints")
    for f in files:
        with open(f, "rb") as fh:
            (n,) = struct.unpack("<Q", fh.read(8))
            header = json.loads(fh.read(n))
        for key, t in header.items():
            if key != "__metadata__":
                count = 1
                for d in t["shape"]:
                    count *= d
                total += count
    return total


def available_memory() -> tuple[int, str]:
    """Free bytes where the engine will hold its weights: the first GPU's, else the
    machine's."""
    import torch

    if torch.cuda.is_available():
        return torch.cuda.mem_get_info(0)[0], "free on GPU 0"
    import psutil

    return psutil.virtual_memory().available, "of memory available"


def check_fits(target: Model, drafters: list[Model], dtype: str, available: tuple[int, str]) -> None:
    """The target and the largest drafter, at ``dtype``, must fit in what is free (one
    engine runs at a time)."""
    per = DTYPE_BYTES[dtype]
    need = parameters(target.folder) * per
    largest = max((parameters(d.folder) * per for d in drafters), default=0)
    free, where = available
    if (need + largest) * FIT_MARGIN > free:
        gib = 1 << 30
        raise InputError(f"--target {target.name}: its weights take {need / gib:.1f} GiB as {dtype} "
                         f"({(need + largest) / gib:.1f} GiB with the largest drafter, plus room to run), but only "
                         f"{free / gib:.1f} GiB is {where}; pick a smaller target or --dtype, or free memory")


def vocabulary_relation(target: Path, drafter: Path) -> tuple[bool, bool]:
    """(whether the pair shares one vocabulary, ids and strings and embedding size, as
    vLLM's ``draft_model`` requires; whether it agrees id for id, so our plugin bridges
    it with an id map: the same vocabulary, or a near-same one)."""
    from transformers import AutoConfig

    from vllm_hetero_spec.vocab.bridge import VocabBridge

    sizes = [AutoConfig.from_pretrained(m).get_text_config().vocab_size for m in (drafter, target)]
    bridge = VocabBridge.build(str(drafter), str(target), *sizes)
    return bridge.same_vocab and sizes[0] == sizes[1], bridge.id_map is not None


def _numbers(flag: str, text: str, cast: type, minimum: int, example: str) -> list:
    """``text``'s comma-separated values as ``cast`` (int or float), sorted, once each."""
    kind = "integers" if cast is int else "numbers"
    try:
        values = sorted({cast(x) for x in text.split(",") if x.strip()})
    except ValueError:
        raise InputError(f"{flag} {text!r}: expected {kind} separated by commas, e.g. {example}") from None
    if not values or values[0] < minimum:
        raise InputError(f"{flag} {text!r}: expected {kind} >= {minimum}, e.g. {example}")
    return values


def rules_per_temperature(text: str | None, temperatures: list[float], id_mapped: bool = False
                          ) -> dict[str, list[str]]:
    """The rules measured at each temperature: ``--rules``, else the candidates ``auto``
    takes for its kind of request (for a pair that agrees id for id, ``tli`` alone:
    ``vllm_integration/startup_checks.py``)."""
    if text:
        rules = list(dict.fromkeys(r.strip() for r in text.split(",") if r.strip()))
        bad = [r for r in rules if r not in LOSSLESS_RULES]
        if bad or not rules:
            raise InputError(f"--rules {text!r}: {', '.join(bad) or 'empty'}; choose among the lossless rules "
                             f"{', '.join(LOSSLESS_RULES)}")
        return {str(t): rules for t in temperatures}
    if id_mapped:
        return {str(t): ["tli"] for t in temperatures}
    defaults = HeteroSettings.__dataclass_fields__
    greedy, sampled = defaults["auto_greedy"].default, defaults["auto_sampled"].default
    return {str(t): list(greedy if t == 0 else sampled) for t in temperatures}


def engine_dtype(requested: str) -> str:
    """``auto``: vLLM's choice, except float32 on a CPU without native bf16 (bf16 is
    emulated there, and far slower)."""
    if requested != "auto":
        return requested
    from vllm_hetero_spec.drafter.runtime.draft_dtype import cpu_flags, platform_device_type, resolve_draft_dtype

    if platform_device_type() == "cuda":
        return "auto"
    return resolve_draft_dtype("auto", None, "cpu", cpu_flags())[0]


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m vllm_hetero_spec advise",
        description="Measure candidate drafters on your prompts, project the speedup of each over plain decoding "
                    "per batch size and temperature, and write the speculative config to use.")
    ap.add_argument("--target", required=True, help="the target model: a Hugging Face repo id, a folder, or a short name set-up built")
    ap.add_argument("--drafters", required=True, help="candidate drafters, comma-separated (ids, folders or short names)")
    ap.add_argument("--prompts", default="spec-bench",
                    help=f"a jsonl file of {{\"prompt\": ...}} or {{\"messages\": [...]}} rows, or {', '.join(BUILT_IN)}")
    ap.add_argument("--num-prompts", type=int, default=13,
                    help="prompts taken from --prompts (default 13: a built-in set gives one per category)")
    ap.add_argument("--max-tokens", type=int, default=48, help="tokens generated per prompt (default 48)")
    ap.add_argument("--output-lengths", default=DEFAULT_LENGTHS,
                    help="output tokens per request to project at and choose the config for: the lengths your "
                         f"users generate (default {DEFAULT_LENGTHS})")
    ap.add_argument("--batch-sizes", default="1,8", help="batch sizes to project for (default 1,8)")
    ap.add_argument("--temperatures", default="0,1", help="temperatures to project for (default 0,1)")
    ap.add_argument("--rules", help="lossless rules to measure (default: auto's candidates for each temperature)")
    ap.add_argument("--k", type=int, default=6, help="the longest draft measured (default 6)")
    ap.add_argument("--out", help="write the recommended speculative config here (JSON)")
    ap.add_argument("--results-dir", default="advise-results", help="table, plot, JSON and vLLM's log (default "
                    "./advise-results)")
    ap.add_argument("--dtype", default="auto", choices=sorted(DTYPE_BYTES),
                    help="the engines' dtype (auto: vLLM's, float32 on a CPU without native bf16)")
    ap.add_argument("--max-model-len", type=int, default=2048)
    ap.add_argument("--no-draft-model", action="store_true", help="skip vLLM's draft_model for same-vocabulary drafters")
    ap.add_argument("--sweep-tokens", type=int, default=16, help="tokens per draft length in the cost sweep")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--enforce-eager", action="store_true",
                    help="measure engines without torch.compile, as `vllm serve --enforce-eager` runs them")
    return ap


@dataclass(frozen=True)
class Plan:
    """Everything checked, before any engine starts."""

    target: Model
    drafters: list[Model]
    jobs: list[tuple[str, str | None, dict[str, Any]]]  # (label, drafter as named, session job)
    results: Path
    dtype: str  # the target's, as the engines run it: the projections hold for it


def plan(args: argparse.Namespace, available: tuple[int, str] | None = None) -> Plan:
    """Check the arguments and lay out the engines to run (raises :class:`InputError`)."""
    target = resolve_model("--target", args.target)
    names = list(dict.fromkeys(d.strip() for d in args.drafters.split(",") if d.strip()))
    if not names:
        raise InputError("--drafters is empty; name at least one draft model, e.g. smollm2-135m")
    if "plain" in names:
        raise InputError("--drafters 'plain': plain decoding is always measured; name draft models only "
                         "(a folder called plain: ./plain)")
    drafters = [resolve_model("--drafters", d) for d in names]
    for flag, value, low in (("--num-prompts", args.num_prompts, 1), ("--max-tokens", args.max_tokens, 2),
                             ("--k", args.k, 1), ("--sweep-tokens", args.sweep_tokens, 2)):
        if value < low:
            raise InputError(f"{flag} {value}: must be at least {low}")
    sizes = _numbers("--batch-sizes", args.batch_sizes, int, 1, "1,8")
    temps = _numbers("--temperatures", args.temperatures, float, 0, "0,1")
    _numbers("--output-lengths", args.output_lengths, int, 2, DEFAULT_LENGTHS)
    rules_per_temperature(args.rules, temps)  # a bad --rules fails before any model is read
    try:
        prompts = load_prompts(args.prompts, args.num_prompts)
    except PromptError as err:
        raise InputError(str(err)) from None
    if sizes[-1] > len(prompts):
        raise InputError(f"--batch-sizes {args.batch_sizes!r}: batch {sizes[-1]} needs at least {sizes[-1]} prompts, "
                         f"and --prompts gives {len(prompts)}; add prompts or lower the batch size")
    dtype = engine_dtype(args.dtype)
    check_fits(target, drafters, dtype, available or available_memory())
    base = {**base_job(str(target.folder), prompts, dtype=dtype, max_model_len=args.max_model_len, seed=args.seed,
                       max_tokens=args.max_tokens, k=args.k, batch_sizes=sizes, temperatures=temps,
                       enforce_eager=args.enforce_eager),
            "sweep_tokens": args.sweep_tokens, "sweep_ks": sorted({0, 1, 2, 4, args.k} & set(range(args.k + 1)))}
    jobs: list[tuple[str, str | None, dict[str, Any]]] = [("plain", None, {**base, "kind": "plain", "drafter": None})]
    for d in drafters:
        same, id_mapped = vocabulary_relation(target.folder, d.folder)
        jobs.append((d.name, d.name, {**base, "kind": "hetero", "drafter": d.config_name,
                                      "rules": rules_per_temperature(args.rules, temps, id_mapped)}))
        if not args.no_draft_model and same:
            jobs.append((draft_model_label(d.name), d.name, {**base, "kind": "draft_model", "drafter": str(d.folder)}))
    return Plan(target, drafters, jobs, Path(args.results_dir), dtype)


def root_cause(log_text: str) -> str:
    """The first line of a failed engine's log that names an error other than vLLM's
    generic wrap-ups, else its last lines."""
    lines = log_text.splitlines()
    for line in lines:
        if re.search(r"\b\w*(Error|Exception): ", line) and not any(g in line for g in _GENERIC):
            return line.split("] ", 1)[-1].strip()
    return "\n".join(lines[-15:])


def session_env() -> dict[str, str]:
    """The sessions' environment: the user's, with a KV cache size on a CPU (see
    :data:`CPU_KV_GIB`)."""
    from vllm_hetero_spec.drafter.runtime.draft_dtype import platform_device_type

    env = dict(os.environ)
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    if platform_device_type() == "cpu":
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", CPU_KV_GIB)
    return env


def run_session(label: str, job: dict[str, Any], log: Path, bar: Any) -> dict[str, Any]:
    """One engine's session in a process of its own; its progress lines move ``bar``."""
    with tempfile.TemporaryDirectory(prefix="advise-") as tmp:
        job_path, out_path = Path(tmp) / "job.json", Path(tmp) / "out.json"
        job_path.write_text(json.dumps(job))
        bar.set_description(label)
        with open(log, "a") as log_file:
            log_file.write(f"\n===== {label} =====\n")
            log_file.flush()
            proc = subprocess.Popen([sys.executable, "-m", "vllm_hetero_spec.advise.session", str(job_path),
                                     str(out_path)], stdout=subprocess.PIPE, stderr=log_file, text=True,
                                    env=session_env())
            for line in proc.stdout:
                if line.startswith(PROGRESS):
                    bar.update(1)
                else:
                    log_file.write(line)
            code = proc.wait()
        if code != 0 or not out_path.is_file():
            section = log.read_text().rsplit(f"===== {label} =====", 1)[-1]
            raise AdviseError(f"the {label} engine failed (exit {code}): {root_cause(section)}\n(its log: {log})")
        return json.loads(out_path.read_text())


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        p = plan(args)
    except InputError as err:
        print(f"advise: {err}", file=sys.stderr)
        return 2
    from tqdm import tqdm

    p.results.mkdir(parents=True, exist_ok=True)
    log = p.results / "advise.log"
    log.write_text("")
    print(f"advise: {len(p.jobs)} engines, one at a time; vLLM's logs: {log}", flush=True)
    measured: dict[str, Any] = {}
    with tqdm(total=sum(planned_calls(job) for _, _, job in p.jobs), unit="pass") as bar:
        for label, _, job in p.jobs:
            try:
                measured[label] = run_session(label, job, log, bar)
            except AdviseError as err:
                if job["kind"] != "draft_model":
                    print(f"advise: {err}", file=sys.stderr)
                    return 1
                bar.write(f"advise: vLLM's draft_model did not run with {job['drafter']}; left out ({log})")
                bar.update(planned_calls(job))
    meta = {"target": p.target.name, "drafters": [d.name for d in p.drafters], "args": vars(args),
            "target_dtype": p.dtype, "measured": measured}
    try:
        rec = report(meta, p.drafters, p.results, args.out)
    except AdviseError as err:
        print(f"advise: {err} (the measurements: {log})", file=sys.stderr)
        return 1
    if rec.config is not None and not args.out:
        print(f"advise: the config (--out FILE writes it): {json.dumps(rec.config)}")
    return 0


def report(meta: dict[str, Any], drafters: list[Model], results: Path, out: str | None) -> Recommendation:
    """Options and the recommendation from the measured sessions (``meta["measured"]``,
    by label: ``plain``, a drafter's name, ``<name> (vLLM draft_model)``), printed and
    written to ``results`` (table, plot, JSON) and the config to ``out``."""
    measured, k = meta["measured"], meta["args"]["k"]
    # a result kept by an earlier version has no lengths: today's default
    lengths = tuple(_numbers("--output-lengths", meta["args"].get("output_lengths") or DEFAULT_LENGTHS, int, 2,
                             DEFAULT_LENGTHS))
    options: list[Option] = []
    for d in drafters:
        if d.name in measured:
            options += hetero_options(d.name, measured[d.name], measured["plain"], k, lengths)
        if draft_model_label(d.name) in measured:
            options += draft_model_options(d.name, measured[draft_model_label(d.name)], measured["plain"], k, lengths,
                                           options)
    rec = recommend(options, {d.name: ConfigNames(d.config_name, str(d.folder)) for d in drafters})
    md, says = table(options), verdict(rec)
    print(md)
    print(says)
    (results / "advise.md").write_text(f"# advise: {meta['target']}\n\n{md}\n\n{says}\n")
    picture = plot(options, [d.name for d in drafters], results / "advise.png")
    write_json(results / "advise.json", options, rec, meta)
    if rec.config is not None and out:
        Path(out).write_text(json.dumps(rec.config, indent=2) + "\n")
        print(f"advise: wrote {out}: {json.dumps(rec.config)}")
    print(f"advise: table, JSON{' and plot' if picture else ''} in {results}/")
    return rec


def reanalyse(results: Path, out: str | None = None) -> dict[str, Any]:
    """advise's result in ``results`` analysed again from its kept measurements, by
    this version's analysis, and rewritten (table, plot, JSON, and the config to
    ``out``): a change to the projection or the config it writes needs no engine run."""
    meta = json.loads((results / "advise.json").read_text())
    kept = {key: meta[key] for key in ("target", "drafters", "args", "measured")}
    if "target_dtype" in meta:  # recorded since 2026-12-07
        kept["target_dtype"] = meta["target_dtype"]
    report(kept, [resolve_model("--drafters", name) for name in kept["drafters"]], results, out)
    return json.loads((results / "advise.json").read_text())
