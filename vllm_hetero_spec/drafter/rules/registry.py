"""Each rule's draft rule, registered once: the one place a rule's name becomes behaviour.

The draft loop (``drafter/draft_loop.py``) is the same for every rule. What differs is
how a position is sampled, how the step's draft tokens become target-vocabulary
proposals, and what verification gets with them:

- token level (``tli``, ``fsd``, ``union``): sample through the intersection map; the
  proposals are the mapped ids, q the exact distribution they were drawn from;
- string level (``slem``, lossless ``dtw``): sample freely, re-tokenize the draft text
  with the target tokenizer, verify one-hot;
- ``dtw`` faithful: as ``slem``, plus TokenTiming's transferred probabilities;
- ``slrs``: a first target token drawn from psi, then as ``slem``.

An engine holds one draft rule per rule it may use: its algorithm's, or with
``algorithm: auto`` every candidate (``policy/rule_choice.py`` picks one per request each
step). The proposer, the budget and the sampler read a rule's traits here, through the
draft rule classes, without an engine.
"""

from __future__ import annotations

from vllm_hetero_spec.config import HeteroSettings
from vllm_hetero_spec.drafter.context import DraftContext
from vllm_hetero_spec.drafter.rules.base import DraftRule
from vllm_hetero_spec.drafter.rules.dtw import DtwFaithful
from vllm_hetero_spec.drafter.rules.slrs.rule import Slrs
from vllm_hetero_spec.drafter.rules.token_level import Fsd, TokenLevel

DRAFT_RULES: dict[str, type[DraftRule]] = {
    "slem": DraftRule,
    "dtw": DraftRule,
    "slrs": Slrs,
    "tli": TokenLevel,
    "union": TokenLevel,
    "fsd": Fsd,
}


def draft_rule_class(rule: str, settings: HeteroSettings) -> type[DraftRule]:
    """The class that drafts ``rule`` under ``settings`` (``dtw`` by its verification mode)."""
    if rule == "dtw" and settings.dtw_verify == "faithful":
        return DtwFaithful
    return DRAFT_RULES[rule]


def engine_rules(settings: HeteroSettings) -> tuple[str, ...]:
    """The rules an engine drafts with (:meth:`HeteroSettings.engine_rules`)."""
    return settings.engine_rules()


def make_draft_rules(ctx: DraftContext) -> dict[str, DraftRule]:
    """The draft rule of each rule the engine may use, in :func:`engine_rules`' order."""
    return {rule: draft_rule_class(rule, ctx.settings)(ctx, rule) for rule in engine_rules(ctx.settings)}


def divergence_rule(settings: HeteroSettings) -> type[DraftRule] | None:
    """The draft rule of this engine's rule whose verification adds a divergence test
    (``fsd``'s), or None: it gives the test and reads each request's threshold."""
    for rule in engine_rules(settings):
        cls = draft_rule_class(rule, settings)
        if cls.divergence(settings) is not None:
            return cls
    return None


def forward_only_rules() -> frozenset[str]:
    """The rules that draft by the drafter's forwards alone, one per draft position, so a
    draft token costs them all the same (the budget prices them with one fit)."""
    return frozenset(rule for rule, cls in DRAFT_RULES.items() if cls.forward_only)
