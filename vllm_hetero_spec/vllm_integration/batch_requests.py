"""What the proposer reads of vLLM's requests: each row's sampling settings for the
drafter, the rule it names, and whether vLLM cuts its drafts by a grammar.

vLLM's ``propose_draft_token_ids`` hands the proposer token ids only; the settings live
on the runner's ``CachedRequestState.sampling_params``. Bad request arguments never
raise here: the front end refuses them with HTTP 400 (``request_validation.py``), and a
request that bypassed it must not take the engine, and every request on it, down.
"""

from __future__ import annotations

from typing import Any

from vllm_hetero_spec.config import HeteroSettings, request_rule
from vllm_hetero_spec.drafter import DraftRule, RequestParams
from vllm_hetero_spec.log import plugin_logger

logger = plugin_logger(__name__)


def _sampling_params(runner: Any, req_id: str) -> Any:
    return runner.requests[req_id].sampling_params


def request_params(runner: Any, req_id: str, settings: HeteroSettings,
                   divergence_rule: type[DraftRule] | None) -> RequestParams:
    """The request's settings as the drafter reads them; ``divergence_rule``: the draft rule
    that reads each request's ``fsd_threshold``, if the engine has one."""
    p = _sampling_params(runner, req_id)
    if p is None:
        return RequestParams()
    tau = settings.fsd_threshold
    try:
        if divergence_rule is not None:
            tau = divergence_rule.request_threshold(settings, p.extra_args)
    except ValueError as err:
        logger.warning("request %s: %s; using fsd_threshold=%s", req_id, err, tau)
    return RequestParams(float(p.temperature), int(p.top_k or 0), float(p.top_p), p.seed, tau)


def tokens_left(runner: Any, req_id: str) -> int | None:
    """The most tokens the request may still emit: its ``max_tokens`` less its output
    (``None`` where vLLM sets no bound). The draft budget reads it: a draft past the
    request's end earns nothing, and a catch-up must be repaid before it."""
    state = runner.requests[req_id]
    p = state.sampling_params
    if p is None or p.max_tokens is None:
        return None
    return max(int(p.max_tokens) - len(state.output_token_ids), 0)


def asked_rule(runner: Any, req_id: str, offered: tuple[str, ...]) -> str | None:
    """The rule the request names (``extra_args["algorithm"]``) among ``offered``, or
    None: ``auto`` chooses (a name the engine lacks is logged and left to ``auto``)."""
    p = _sampling_params(runner, req_id)
    if p is None:
        return None
    try:
        return request_rule(p.extra_args, offered)
    except ValueError as err:
        logger.warning("request %s: %s; auto chooses its rule", req_id, err)
        return None


def grammar_cut(runner: Any, req_id: str) -> bool:
    """Whether vLLM's scheduler cuts this request's drafts at the first token its
    grammar rejects (structured outputs): verified one-hot then (``verify/plan.py``)."""
    p = _sampling_params(runner, req_id)
    return p is not None and p.structured_outputs is not None
