"""A model as a vLLM user names it -- a folder, a Hugging Face repo id (with a revision),
or a short name set-up has built -- made into a folder the plugin can read.

Why one resolver: the plugin reads files of models it did not load through vLLM (the
drafter's config, both tokenizers for the vocabulary bridge, safetensors headers in
``advise``), and every reader must take the names vLLM takes, in the same order, with
the same environment: ``HF_HUB_OFFLINE``, ``HF_HOME`` / ``HF_HUB_CACHE``, ``HF_TOKEN``
and ``HF_ENDPOINT`` (read by ``huggingface_hub``, which vLLM downloads with), and
``VLLM_USE_MODELSCOPE``. An id is downloaded on first use through vLLM's own Hub client
and its per-model file lock, into the cache vLLM uses, so the drafter's weights, which
vLLM's loader reads by the same id and revision, land beside them.

Order: an existing folder; else a short name set-up has built (``model_store.py``);
else a Hub id. A name that resolves to nothing raises :class:`ModelNotFound`, naming
the key, what was tried and the fix.
"""

from __future__ import annotations

import functools
from pathlib import Path

from vllm_hetero_spec.model_store import SHORT_NAMES, set_up_model

#: The files a reader needs without the weights (config, tokenizer, chat template).
#: The weights are vLLM's loader's to fetch, by its own rules (safetensors first).
NON_WEIGHT_PATTERNS = ["*.json", "*.txt", "*.model", "*.tiktoken", "*.jinja", "*.py"]
#: The weight files ``advise`` reads headers of (vLLM's loader prefers safetensors).
WEIGHT_PATTERNS = ["*.safetensors"]


class ModelNotFound(ValueError):
    """A model name that is neither a folder, a set-up short name, nor a reachable Hub id."""


def looks_like_path(name: str) -> bool:
    """A name written as a path (absolute, relative with ``.``, ``~``, or more than one
    ``/``; a Hub id is ``name`` or ``org/name``): it is never sent to the Hub, where it
    would only produce a confusing 'repo id' error."""
    return name.startswith(("/", ".", "~")) or name.count("/") > 1


@functools.lru_cache(maxsize=64)
def locate(name: str, *, key: str = "model", revision: str | None = None, download_dir: str | None = None,
           weights: bool = False, need_config: bool = True) -> Path:
    """The local folder ``name`` stands for, downloading an id on first use.

    Args:
        name: a folder, a set-up short name, or a Hub repo id (``org/name``).
        key: the config key or flag that named it, for the error.
        revision: the Hub revision (branch, tag or commit) of an id; ignored for folders.
        download_dir: the cache folder vLLM's ``--download-dir`` names (``None``: the
            Hugging Face cache).
        weights: also fetch the safetensors weights (``advise`` reads their headers).
        need_config: the folder must hold a ``config.json`` (a model, not a tokenizer alone).

    Raises:
        ModelNotFound: naming ``key``, what was tried (folder, set-up, cache, Hub) and the fix.
    """
    path = Path(name).expanduser()
    if path.is_dir():
        if need_config and not (path / "config.json").is_file():
            raise ModelNotFound(f"'{key}' = {name!r} is a folder without config.json; point it at a model folder "
                                "(the one with config.json and the weights)")
        return path
    built = set_up_model(name)
    if built is not None:
        return built
    if name in SHORT_NAMES:
        raise ModelNotFound(f"'{key}' = {name!r} is a short name set-up has not built yet; build it first with "
                            f"`bash scripts/setup.sh {name}` (the plugin installs nothing), or name the model by its "
                            "Hugging Face repo id or folder")
    if looks_like_path(name) or not name:
        raise ModelNotFound(f"'{key}' = {name!r}: no such folder; point it at a model folder, a Hugging Face "
                            "repo id (e.g. 'HuggingFaceTB/SmolLM2-135M-Instruct') or a short name set-up builds ("
                            + ", ".join(SHORT_NAMES) + ")")
    try:
        folder = Path(_download(name, revision, download_dir, weights))
    except Exception as err:  # the Hub client raises many types (offline, 404, auth, bad id, network)
        raise ModelNotFound(_not_found(key, name, revision, err)) from None
    if need_config and not (folder / "config.json").is_file():
        raise ModelNotFound(f"'{key}' = {name!r}: the repo has no config.json at revision {revision or 'main'}; "
                            "name a model repo (a transformers checkpoint)")
    return folder


def use_modelscope() -> bool:
    """``VLLM_USE_MODELSCOPE``, parsed by vLLM's own table of its variables."""
    from vllm.envs import environment_variables

    return bool(environment_variables["VLLM_USE_MODELSCOPE"]())


def _download(name: str, revision: str | None, download_dir: str | None, weights: bool) -> str:
    """A snapshot of ``name`` through the client vLLM uses (ModelScope where
    ``VLLM_USE_MODELSCOPE`` asks), offline where ``HF_HUB_OFFLINE`` says."""
    import huggingface_hub
    from vllm.model_executor.model_loader.weight_utils import get_lock

    patterns = NON_WEIGHT_PATTERNS + (WEIGHT_PATTERNS if weights else [])
    offline = huggingface_hub.constants.HF_HUB_OFFLINE
    with get_lock(name, download_dir):
        if use_modelscope():
            from modelscope.hub.snapshot_download import snapshot_download

            return snapshot_download(model_id=name, revision=revision, cache_dir=download_dir,
                                     local_files_only=offline, allow_patterns=patterns)
        from vllm.transformers_utils.repo_utils import hf_api

        return hf_api().snapshot_download(repo_id=name, revision=revision, cache_dir=download_dir,
                                          local_files_only=offline, allow_patterns=patterns)


def _not_found(key: str, name: str, revision: str | None, err: Exception) -> str:
    """The one error for a name that resolved to nothing: what was tried, and the fix."""
    import huggingface_hub

    hub = "ModelScope" if use_modelscope() else f"the Hugging Face Hub ({huggingface_hub.constants.ENDPOINT})"
    offline = huggingface_hub.constants.HF_HUB_OFFLINE
    tried = [f"a folder '{name}' (none here)", f"a model set-up built ({', '.join(SHORT_NAMES)}: not one)",
             f"the cache {huggingface_hub.constants.HF_HUB_CACHE}"]
    tried.append("the Hub: not asked, HF_HUB_OFFLINE is set" if offline else hub)
    at = f" at revision {revision!r}" if revision else ""
    fix = ("download it while online (or unset HF_HUB_OFFLINE), point HF_HOME / HF_HUB_CACHE at the cache that "
           "holds it, or give its folder" if offline else
           "check the repo id and revision, set HF_TOKEN for a gated or private repo, or give its folder")
    reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    return f"'{key}' = {name!r}{at} was not found; tried {'; '.join(tried)} ({type(err).__name__}: {reason}). Fix: {fix}"


def draft_model_folder(settings) -> Path:
    """The drafter's folder (config, tokenizer; weights are vLLM's loader's) for
    ``HeteroSettings``: its ``model`` at its ``revision``, in its ``download_dir``."""
    download_dir = (settings.draft_load_config or {}).get("download_dir")
    return locate(settings.draft_model, key="model", revision=settings.revision, download_dir=download_dir)


def draft_tokenizer_folder(settings) -> Path:
    """The drafter's tokenizer: ``draft_tokenizer`` where given, else the model's own (at
    the model's revision)."""
    if settings.draft_tokenizer in (None, settings.draft_model):
        return draft_model_folder(settings)
    return locate(settings.draft_tokenizer, key="draft_tokenizer", need_config=False)


def target_tokenizer_folder(model_config) -> Path:
    """The target's tokenizer as vLLM's ``ModelConfig`` names it (``--tokenizer``, else
    the model), at its ``tokenizer_revision``."""
    revision = getattr(model_config, "tokenizer_revision", None)
    return locate(str(model_config.tokenizer), key="tokenizer", revision=revision, need_config=False)
