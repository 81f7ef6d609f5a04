"""The plugin's command line: ``python -m vllm_hetero_spec advise ...`` (see
:mod:`vllm_hetero_spec.advise.cli`)."""

from __future__ import annotations

import sys

COMMANDS = ("advise",)


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in COMMANDS:
        print("usage: python -m vllm_hetero_spec advise --target T --drafters a,b,c [--prompts my.jsonl] "
              "[--batch-sizes 1,8] [--temperatures 0,1] [--out hetero.json]\n"
              "       python -m vllm_hetero_spec advise --help", file=sys.stderr)
        return 2
    from vllm_hetero_spec.advise.cli import main as advise

    return advise(argv[1:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
