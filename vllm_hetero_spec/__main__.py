"""The plugin's command line: ``python -m vllm_hetero_spec advise ...`` (see
:mod:`vllm_hetero_spec.advise.cli`)."""

from __future__ import annotations

import sys

COMMANDS = ("advise",)


def main(argv: list[str]) -> int:
    from vllm_hetero_spec.advise.cli import main as advise
    from vllm_hetero_spec.advise.cli import parser

    if not argv or argv[0] not in COMMANDS:
        print(parser().format_usage().rstrip(), "\n(python -m vllm_hetero_spec advise --help explains each option)",
              file=sys.stderr)
        return 2
    return advise(argv[1:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
