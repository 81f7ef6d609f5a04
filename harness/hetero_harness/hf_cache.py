"""A Hugging Face cache, laid out as ``huggingface_hub`` lays one out, holding set-up's
converted models under their upstream repo ids: how the tests name models as vLLM users
do (``HuggingFaceTB/SmolLM2-135M-Instruct``) on a machine that cannot reach the Hub.

The converted weights are not the Hub's bytes (they come from GGUF files), so this cache
is only ever built in a temporary ``HF_HOME`` that a test points ``HF_HUB_OFFLINE=1``
processes at, never in a user's own cache. Files are links to set-up's folders (no copy).
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

#: Set-up's short names and the Hub repos their GGUF files were converted from.
UPSTREAM_IDS = {
    "smollm2-135m": "HuggingFaceTB/SmolLM2-135M-Instruct",
    "gemma3-270m": "google/gemma-3-270m",
    "qwen2.5-coder-0.5b": "Qwen/Qwen2.5-Coder-0.5B-Instruct",
    "qwen2.5-coder-1.5b": "Qwen/Qwen2.5-Coder-1.5B-Instruct",
}


def commit_of(repo_id: str, revision: str) -> str:
    """A stable 40-hex commit id for a repo's revision in this cache."""
    return hashlib.sha1(f"{repo_id}@{revision}".encode()).hexdigest()


def add_repo(hub: Path, repo_id: str, folder: Path, revision: str = "main",
             overrides: dict[str, str] | None = None) -> Path:
    """Put ``folder``'s files into ``hub`` as ``repo_id`` at ``revision`` (a ref naming a
    snapshot), as ``huggingface_hub`` would after a download; ``overrides`` replaces
    files' text in this revision only. Returns the snapshot folder."""
    repo = hub / ("models--" + repo_id.replace("/", "--"))
    commit = commit_of(repo_id, revision)
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True, exist_ok=True)
    for f in sorted(folder.iterdir()):
        if f.is_file() and not f.name.startswith(".") and f.name not in (overrides or {}):
            link = snapshot / f.name
            if not link.exists():
                os.symlink(f.resolve(), link)
    for name, text in (overrides or {}).items():
        (snapshot / name).write_text(text)
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / revision).write_text(commit)
    return snapshot


def build_cache(home: Path, folders: dict[str, Path]) -> Path:
    """An ``HF_HOME`` at ``home`` whose hub cache holds each short name's folder under its
    upstream id; returns the hub cache folder (``HF_HUB_CACHE``)."""
    hub = home / "hub"
    hub.mkdir(parents=True, exist_ok=True)
    for short, folder in folders.items():
        add_repo(hub, UPSTREAM_IDS[short], folder)
    return hub


def offline_env(home: Path) -> dict[str, str]:
    """The variables that make a process read models from the cache at ``home`` only."""
    return {"HF_HOME": str(home), "HF_HUB_CACHE": str(home / "hub"), "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1"}
