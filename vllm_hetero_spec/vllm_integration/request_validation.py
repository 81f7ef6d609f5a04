"""Per-request hetero settings, checked where vLLM can still answer the client.

A per-request setting (``SamplingParams.extra_args``, which the OpenAI server fills from
``vllm_xargs``) reaches our proposer inside the engine process, where any exception
kills the engine for every client. So bad values are refused in the front end with
vLLM's own ``VLLMValidationError``, which the server turns into HTTP 400 naming the
parameter (a plain ``ValueError`` there becomes a 500) and which ``LLM.generate``
raises to the caller.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from typing import Any

from vllm.exceptions import VLLMValidationError

from vllm_hetero_spec.config import FSD_THRESHOLD_ARG, RULE_ARG, request_fsd_threshold, request_rule


REQUEST_KEYS = (FSD_THRESHOLD_ARG, RULE_ARG)


def check_extra_args(extra_args: Mapping[str, Any] | None, engine_rules: tuple[str, ...] | None = None) -> None:
    """Raise ``VLLMValidationError`` for a per-request hetero setting that cannot be used.

    ``extra_args`` is shared with vLLM and other plugins, so unknown keys are allowed,
    except near-misses of ours (a typo would otherwise be ignored silently).
    ``engine_rules``: the rules the engine drafts with, where the caller knows them (a
    request may name only those); None checks that a named rule exists."""
    if not extra_args:
        return
    for key in extra_args:
        if key not in REQUEST_KEYS:
            close = difflib.get_close_matches(key, REQUEST_KEYS, n=1, cutoff=0.8)
            if close:
                raise VLLMValidationError(
                    f"unknown per-request setting vllm_xargs.{key}; did you mean '{close[0]}'?",
                    parameter=f"vllm_xargs.{key}",
                )
    if RULE_ARG in extra_args:
        try:
            request_rule(extra_args, engine_rules)
        except ValueError as err:
            raise VLLMValidationError(str(err), parameter=f"vllm_xargs.{RULE_ARG}", value=extra_args[RULE_ARG]) from err
    if FSD_THRESHOLD_ARG not in extra_args:
        return
    try:
        request_fsd_threshold(extra_args, 0.0)
    except ValueError as err:
        raise VLLMValidationError(
            f"vllm_xargs.{FSD_THRESHOLD_ARG}: {err}",
            parameter=f"vllm_xargs.{FSD_THRESHOLD_ARG}",
            value=extra_args[FSD_THRESHOLD_ARG],
        ) from err
