"""Mutation check: apply known-bad changes to the package one at a time and report which
test catches each. Not collected by pytest (no ``test_`` prefix) and not run by CI: a
developer runs it after changing the verification path or its tests.

    .venv/bin/python tests/mutations.py            # all mutations
    .venv/bin/python tests/mutations.py M9 M10     # some of them

Each mutation runs in a scratch copy of the package and tests (``PYTHONPATH``), so the
working tree is never touched. A mutation is *caught* when its tests fail; every one of
these must be caught.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Mutation:
    name: str
    what: str
    path: str  # inside the repository
    old: str
    new: str
    tests: tuple[str, ...]  # pytest arguments that must fail


MUTATIONS = [
    Mutation(
        "top-p-tie", "verification's top-p keeps its own choice among logits tied across the cut",
        "vllm_hetero_spec/verify/top_k_top_p.py",
        "    return tie.squeeze(1) | near.any(dim=1)",
        "    return near.any(dim=1)",
        ("tests/verify/test_top_k_top_p.py", "-k", "ties"),
    ),
    Mutation(
        "zero-mass", "a row without top-k and top-p keeps tokens of probability 0, which vLLM's sort masks",
        "vllm_hetero_spec/verify/top_k_top_p.py",
        '    return logits.masked_fill_(logits.softmax(dim=-1) == 0, float("-inf"))',
        "    return logits",
        ("tests/verify/test_top_k_top_p.py", "-k", "without_filters"),
    ),
    Mutation(
        "bonus-unfiltered", "a hetero engine's own sampler drops top-k and top-p instead of applying them",
        "vllm_hetero_spec/vllm_integration/cpu_fixes.py",
        "            logits = top_k_top_p_without_sort(logits, k, p, topk_topp_sampler.apply_top_k_top_p)\n",
        "",
        ("tests/plugin/test_sampler_filter.py",),
    ),
    Mutation(
        "M9", "the sampler adapter skips vLLM's temperature/top-k/top-p on p",
        "vllm_hetero_spec/verify/sampler.py",
        "target_logits = constrain(target_logits, metadata.cu_num_draft_tokens, sampling_metadata, min_p)",
        "target_logits = target_logits",
        ("tests/verify/test_sampler_adapter.py",),
    ),
    Mutation(
        "M10", "slrs draws its first token uniformly over the candidates instead of from q",
        "vllm_hetero_spec/drafter/rules/slrs/first_token.py",
        "_draw(law if gen is None else law.to(gen.device), gen)",
        "_draw((law > 0).float() if gen is None else (law > 0).float().to(gen.device), gen)",
        ("tests/drafter/test_proposer_token_level.py", "-k", "drawn_from_the_q"),
    ),
    Mutation(
        "bias", "the acceptance ratio inflated by 0.5%",
        "vllm_hetero_spec/verify/rules.py",
        "accept = uniform * q_x < p_x\n",
        "accept = uniform * q_x < p_x * 1.005\n",
        ("tests/verify/test_rules_power.py",),
    ),
    Mutation(
        "seeded-stochastic", "seeded rows are verified by rejection sampling (their tokens then follow the drafts)",
        "vllm_hetero_spec/verify/sampler.py",
        "        exact = [g or r in drafted_seeded for r, g in enumerate(rows.greedy)]",
        "        exact = list(rows.greedy)",
        ("tests/verify/test_sampler_adapter.py", "-k", "whatever_was_drafted"),
    ),
    Mutation(
        "seeded-bonus-position", "the bonus token of a seeded row is drawn with the generator of its first position",
        "vllm_hetero_spec/verify/sampler.py",
        "[rows.positions[r] + offsets[r] for r in ordered]",
        "[rows.positions[r] for r in ordered]",
        ("tests/verify/test_sampler_adapter.py", "-k", "whatever_was_drafted"),
    ),
    Mutation(
        "bias-drafted-rows", "logit_bias is not applied at the drafted positions (only at the bonus)",
        "vllm_hetero_spec/verify/sampler.py",
        "        target_logits = add_logit_bias(target_logits, sampling_metadata.logitsprocs, num_draft)\n",
        "",
        ("tests/verify/test_target_constraints.py",),
    ),
    Mutation(
        "min-p-skipped", "min_p is not applied at the drafted positions (only at the bonus)",
        "vllm_hetero_spec/verify/target_constraints.py",
        "    if min_p is not None:\n        apply_min_p(logits, min_p)\n",
        "",
        ("tests/verify/test_target_constraints.py",),
    ),
    Mutation(
        "min-p-late", "min_p is applied after top-k and top-p instead of before them",
        "vllm_hetero_spec/verify/target_constraints.py",
        "    if min_p is not None:\n        apply_min_p(logits, min_p)\n"
        "    return rejection_sampler.apply_top_k_top_p(logits, top_k, top_p)\n",
        "    logits = rejection_sampler.apply_top_k_top_p(logits, top_k, top_p)\n"
        "    return logits if min_p is None else apply_min_p(logits, min_p)\n",
        ("tests/verify/test_target_constraints.py",),
    ),
    Mutation(
        "global-rng", "the drafter samples from the global RNG",
        "vllm_hetero_spec/drafter/sampling.py",
        "noise.exponential_(generator=rows.shared)",
        "noise.exponential_()",
        ("tests/drafter/test_proposer_token_level.py", "-k", "global_rng"),
    ),
    Mutation(
        "read-each", "the draft loop reads back every position on an accelerator",
        "vllm_hetero_spec/drafter/batch_drafter.py",
        'self.defer_reads = self.runtime.device.type != "cpu"',
        "self.defer_reads = False",
        ("tests/drafter/test_draft_loop_device.py",),
    ),
    Mutation(
        "no-wait", "the pinned inputs are rewritten before the previous upload has left",
        "vllm_hetero_spec/drafter/runtime/input_staging.py",
        "            self._event.synchronize()\n",
        "",
        ("tests/drafter/test_draft_loop_device.py",),
    ),
    Mutation(
        "stop-late", "reading once, the stop rules are not applied to the deferred positions",
        "vllm_hetero_spec/drafter/draft_loop.py",
        "                if not self._done[j] and not self._take(j, host[start + pos], q_rows[pos]):",
        "                if not self._take(j, host[start + pos], q_rows[pos]) and False:",
        ("tests/drafter/test_proposer_token_level.py", "-k", "reading_once"),
    ),
    Mutation(
        "rank-rng", "one TP rank draws from its global RNG while drafting (e2e, about 2 minutes)",
        "vllm_hetero_spec/vllm_integration/proposer.py",
        "        if self._check_ranks:\n",
        "        if self._tp is not None and self._tp.rank_in_group == 1:\n            torch.rand(1)\n"
        "        if self._check_ranks:\n",
        ("tests/e2e/test_tensor_parallel.py", "-k", "agree"),
    ),
    Mutation(
        "residual", "the rejected position emits a sample of p instead of the residual",
        "vllm_hetero_spec/verify/rules.py",
        "residual = _dense_q(q_sel, x_rej, vocab).to(p_rej.dtype).neg_().add_(p_rej).clamp_(min=0.0)",
        "residual = p_rej.clone()",
        ("tests/verify/test_rules_lossless.py",),
    ),
    Mutation(
        "force", "union's forced rejections are ignored",
        "vllm_hetero_spec/verify/rules.py",
        "accept &= force_reject.logical_not()",
        "accept &= accept",
        ("tests/verify/test_rules_battery.py", "-k", "union"),
    ),
    Mutation(
        "fuzzy-p0", "fsd's fuzzy test may accept a token the target rules out",
        "vllm_hetero_spec/verify/rules.py",
        "accept |= close & (tau > 0) & (p_x > 0)",
        "accept |= close & (tau > 0)",
        ("tests/verify/test_union_fsd.py",),
    ),
    Mutation(
        "compact-q", "q read at the wrong support column",
        "vllm_hetero_spec/verify/draft_probs.py",
        "col = torch.searchsorted(self.support, tokens).clamp(max=self.support.shape[0] - 1)",
        "col = (torch.searchsorted(self.support, tokens) + 1).clamp(max=self.support.shape[0] - 1)",
        ("tests/verify/test_rules_lossless.py",),
    ),
    Mutation(
        "cut-plan", "a draft cut to the budget's length keeps the q rows of the dropped proposals",
        "vllm_hetero_spec/drafter/messages.py",
        "                self.q_index[row] = self.q_index[row][:n]\n",
        "",
        ("tests/drafter/test_proposer_token_level.py", "-k", "budget"),
    ),
    Mutation(
        "softmax-argmax", "greedy rows compare with the argmax of the float32 softmax, not of the logits",
        "vllm_hetero_spec/verify/sampler.py",
        "else target_logits.argmax(dim=-1)",
        "else target_logits.softmax(dim=-1).argmax(dim=-1)",
        ("tests/verify/test_sampler_adapter.py", "-k", "argmax"),
    ),
    Mutation(
        "threshold", "the acceptance test u * q < p turned into <=",
        "vllm_hetero_spec/verify/rules.py",
        "accept = uniform * q_x < p_x\n",
        "accept = uniform * q_x <= p_x\n",
        ("tests/verify/test_rules_battery.py", "-k", "zero_uniform"),
    ),
    Mutation(
        "drop-stop-token", "draft_stop_prob drops the unsure token instead of stopping after it",
        "vllm_hetero_spec/drafter/draft_loop.py",
        "        tok = int(rec[_ID])\n",
        "        tok = int(rec[_ID])\n"
        "        if self.stop_prob > 0 and rec[-1] < self.stop_prob:\n            return False\n",
        ("tests/drafter/test_proposer_token_level.py", "-k", "stop_prob"),
    ),
    Mutation(
        "grammar-q", "grammar-cut drafts (structured outputs) verified with the real q",
        "vllm_hetero_spec/verify/plan.py",
        "own = [None if r in self.one_hot else r for r in req_ids]",
        "own = list(req_ids)",
        ("tests/verify/test_grammar_cut.py", "-k", "follow"),
    ),
    Mutation(
        "batch-length", "every row drafts the step's longest length (its stream advances by the batch's k)",
        "vllm_hetero_spec/drafter/draft_loop.py",
        "        self.steps = [steps[i] for i in self.order]\n",
        "        self.steps = [max(steps)] * len(steps)\n",
        ("tests/drafter/test_proposer_token_level.py", "-k", "own_length"),
    ),
    Mutation(
        "blind-budget", "the adaptive budget takes every draft as accepted",
        "vllm_hetero_spec/policy/budget.py",
        "gains = np.stack([np.cumprod(self.acceptance(r, rule)) for r, rule in zip(req_ids, rules)])",
        "gains = np.stack([np.ones(self.max_tokens) for r, rule in zip(req_ids, rules)])",
        ("tests/policy/test_budget.py",),
    ),
    Mutation(
        "fading-positions", "a draft position's acceptance fades every step, drafted or not",
        "vllm_hetero_spec/policy/acceptance.py",
        "            acc *= self.stale_memory\n            tri *= self.stale_memory\n",
        "            acc *= self.memory\n            tri *= self.memory\n",
        ("tests/policy/test_acceptance.py",),
    ),
    Mutation(
        "stale-price-kept", "a size back after a long gap keeps its old price",
        "vllm_hetero_spec/policy/step_costs.py",
        "        if mean is not None and stale:",
        "        if False:",
        ("tests/policy/test_step_costs.py", "-k", "overpriced"),
    ),
    Mutation(
        "rising-prices", "the target's curve is forced to rise, pricing a cheap longer size above its cost",
        "vllm_hetero_spec/policy/step_costs.py",
        "            values = fit if standing_in else np.array([known[t] for t in sizes])",
        "            values = fit",
        ("tests/policy/test_budget.py", "tests/policy/test_step_costs.py"),
    ),
    Mutation(
        "one-allowance", "a batch size's probes spend the fullest allowance, whichever batch size earned it",
        "vllm_hetero_spec/policy/budget.py",
        "                if loss <= bucket.allowance:\n",
        "                bucket = max(self.buckets.values(), key=lambda b: b.allowance)\n"
        "                if loss <= bucket.allowance:\n",
        ("tests/policy/test_budget.py", "-k", "own_probes"),
    ),
    Mutation(
        "probe-every-row", "a probe drafts with every row, however far its draft state has fallen behind",
        "vllm_hetero_spec/policy/budget.py",
        "            probing = self._caught_up_rows(req_ids, drafting, lengths)\n",
        "            probing = list(drafting)\n",
        ("tests/policy/test_budget.py", "-k", "caught_up"),
    ),
    Mutation(
        "probe-prices-any-size", "a probe with a few rows caught up is worth a step to price its size",
        "vllm_hetero_spec/policy/budget.py",
        "            if whole and guessed:",
        "            if guessed:",
        ("tests/policy/test_budget.py", "-k", "fresh_batch or large_batch"),
    ),
    Mutation(
        "sampled-priced-as-greedy", "a step drafting for sampled rows is priced on the greedy steps' target curve",
        "vllm_hetero_spec/policy/budget.py",
        "        if _is_sampled(key) and any(self.sampled_target.priced(t) for t in self.sampled_sizes):",
        "        if False:",
        ("tests/policy/test_budget.py", "-k", "own_steps"),
    ),
    Mutation(
        "sampled-on-the-flat-prior", "a sampled rule with few verdicts leans on the flat prior, not its greedy kin",
        "vllm_hetero_spec/policy/acceptance.py",
        "            prior = prior if priors is None else priors[j]",
        "            prior = prior",
        ("tests/policy/test_budget.py", "tests/policy/test_acceptance.py", "-k", "kin or greedy_estimate"),
    ),
    Mutation(
        "acceptance-cached-across-steps", "the overall acceptance estimate is kept past the step that read it",
        "vllm_hetero_spec/policy/acceptance.py",
        "        self._overall_estimates.clear()\n",
        "",
        ("tests/policy/test_acceptance.py", "-k", "once_per_step"),
    ),
    Mutation(
        "untimed-rules-for-free", "a set of rules never timed drafts for free beside timed ones of its kind",
        "vllm_hetero_spec/policy/budget.py",
        "        return max(float(np.mean(kin)), 0.0) if kin else 0.0",
        "        return 0.0",
        ("tests/policy/test_budget.py", "-k", "never_timed"),
    ),
    Mutation(
        "compared-as-run", "auto compares a rule the budget left undrafted at plain speed, as the budget ran it",
        "vllm_hetero_spec/policy/step_policy.py",
        "                for i in rows:\n                    out[i] = 1\n",
        "                for i in rows:\n                    out[i] = 0\n",
        ("tests/policy/test_compared_drafting.py",),
    ),
    Mutation(
        "draft-cost-unbounded", "the draft price's fit takes negative parts: one slow step prices k >= 2 out for good",
        "vllm_hetero_spec/policy/step_costs.py",
        "LinearFit(memory, features, intercept=False, nonnegative=True)",
        "LinearFit(memory, features, intercept=False, nonnegative=False)",
        ("tests/policy/test_step_costs.py", "tests/policy/test_compared_drafting.py"),
    ),
    Mutation(
        "draft-cost-no-fade", "a step far under its price is only averaged in, so a one-time cost lasts",
        "vllm_hetero_spec/policy/step_costs.py",
        "            self.fit.fade(0.5 / self.fit.n)",
        "            self.fit.fade(1.0)",
        ("tests/policy/test_step_costs.py",),
    ),
    Mutation(
        "draft-price-always-known", "a draft price on few or old steps is never probed",
        "vllm_hetero_spec/policy/budget.py",
        "            guessed |= k > 0 and draft_guessed",
        "            guessed |= False",
        ("tests/policy/test_budget.py", "-k", "slow_patch"),
    ),
    Mutation(
        "blind-catchup", "the draft cost fit takes a first pass over a prompt for the cost of drafting k",
        "vllm_hetero_spec/policy/budget.py",
        "            if k > 0 and lengths is not None:",
        "            if k > 0 and lengths is None:",
        ("tests/policy/test_budget.py",),
    ),
    Mutation(
        "blind-lump", "the choice of k ignores how far the draft states have fallen behind",
        "vllm_hetero_spec/policy/budget.py",
        "        behind = [0.0 if lengths is None or not d else",
        "        behind = [0.0 if lengths is not None or not d else",
        ("tests/policy/test_budget.py",),
    ),
    Mutation(
        "blind-end", "the choice of k ignores how many tokens each request has left",
        "vllm_hetero_spec/policy/budget.py",
        "        left = left or [None] * rows\n",
        "        left = [None] * rows\n",
        ("tests/policy/test_budget.py", "-k", "about_to_end"),
    ),
    Mutation(
        "graph-pad-slots", "a graph-padded forward leaves its padding tokens the previous step's KV slots",
        "vllm_hetero_spec/drafter/runtime/cuda_graphs.py",
        "            self.slots.narrow(0, t, padded - t).fill_(self.padding_slot)",
        "            pass",
        ("tests/drafter/test_drafter_runtime.py", "-k", "padded"),
    ),
    Mutation(
        "graph-fresh-inputs", "a graphed forward reads its ids from a fresh tensor, not the captured buffer",
        "vllm_hetero_spec/drafter/runtime/cuda_graphs.py",
        "        return self.input_ids.narrow(0, 0, padded), self.positions",
        "        return self.input_ids.narrow(0, 0, padded).clone(), self.positions",
        ("tests/drafter/test_draft_loop_device.py", "-k", "graphed"),
    ),
    Mutation(
        "auto-one-rule", "auto drafts every row of a mixed batch with the first rule in it",
        "vllm_hetero_spec/drafter/batch_drafter.py",
        "            part, drafted_s = self._step_rule(self.draft_rules[rule], batch, active, budget, stop)",
        "            part, drafted_s = self._step_rule(self.draft_rules[rules[active[0]]], batch, "
        "[i for i, ok in enumerate(ready) if ok], budget, stop)",
        ("tests/drafter/test_mixed_rules.py",),
    ),
    Mutation(
        "auto-row-order", "auto's mixed batch hands rows their drafts in rule order, not batch order",
        "vllm_hetero_spec/drafter/batch_drafter.py",
        "            out = joined.select([where[i] for i in range(len(ready))])",
        "            out = joined",
        ("tests/drafter/test_mixed_rules.py",),
    ),
    Mutation(
        "auto-shared-acceptance", "the budget prices one rule's drafts on another rule's acceptance",
        "vllm_hetero_spec/policy/budget.py",
        '            rule = last.rules.get(req_id, "")',
        '            rule = ""',
        ("tests/policy/test_budget.py",),
    ),
    Mutation(
        "auto-shared-draft-cost", "the budget fits one drafting cost for every rule",
        "vllm_hetero_spec/policy/budget.py",
        "        key = _draft_key(rules, [p > 0 for p in proposed])",
        '        key = ""',
        ("tests/policy/test_budget.py",),
    ),
    Mutation(
        "auto-count-transition", "auto counts a turn's first step, which pays the previous rule's catch-up",
        "vllm_hetero_spec/policy/rule_choice.py",
        "        if kind.turn % 2:  # a turn's second step: free of the previous rule's catch-up",
        "        if True:",
        ("tests/policy/test_rule_choice.py",),
    ),
    Mutation(
        "auto-sticky", "auto runs its first candidate whatever the comparison showed",
        "vllm_hetero_spec/policy/rule_choice.py",
        "            kind.best = challenger",
        "            pass",
        ("tests/policy/test_rule_choice.py",),
    ),
    Mutation(
        "auto-fixed-margin", "auto switches on any lead beyond the fixed margin, however noisy the comparison",
        "vllm_hetero_spec/policy/rule_choice.py",
        "        return challenger > incumbent * (1 + max(self.switch_margin, self.confidence * noise))",
        "        return challenger > incumbent * (1 + self.switch_margin)",
        ("tests/policy/test_rule_choice.py",),
    ),
    Mutation(
        "auto-no-futility", "auto compares for the whole window even when the challenger clearly trails",
        "vllm_hetero_spec/policy/rule_choice.py",
        "        if best.rate > other.rate * (1 + self.futility * noise):",
        "        if False:",
        ("tests/policy/test_rule_choice.py",),
    ),
    Mutation(
        "auto-no-decline", "auto runs a challenger's turn at plain speed where the budget would not draft it",
        "vllm_hetero_spec/policy/rule_choice.py",
        "        if drafts is None:\n            return rules",
        "        if True:\n            return rules",
        ("tests/policy/test_rule_choice.py",),
    ),
    Mutation(
        "auto-declined-wins", "a challenger that sat out a comparison can win it on an earlier rate",
        "vllm_hetero_spec/policy/rule_choice.py",
        "        rivals = [r for r in kind.candidates if r != best and r not in out and r in kind.rates]",
        "        rivals = [r for r in kind.candidates if r != best and r in kind.rates]",
        ("tests/policy/test_rule_choice.py",),
    ),
    Mutation(
        "auto-blocks", "auto compares rules in blocks of 16 steps instead of turns of two",
        "vllm_hetero_spec/policy/rule_choice.py",
        "            return self.candidates[self.turn // 2 % len(self.candidates)]",
        "            return self.candidates[self.turn // 16 % len(self.candidates)]",
        ("tests/policy/test_rule_choice.py",),
    ),
    Mutation(
        "undrafted-greedy", "a step without drafts takes every row's argmax, sampled rows included",
        "vllm_hetero_spec/verify/sampler.py",
        "        return SamplerOutput(sampled_token_ids=out.sampled_token_ids, logprobs_tensors=None)",
        "        return SamplerOutput(sampled_token_ids=logits.argmax(-1, keepdim=True).to(torch.int32),\n"
        "                             logprobs_tensors=None)",
        ("tests/verify/test_sampler_adapter.py",),
    ),
    Mutation(
        "undrafted-unseeded", "a step without drafts samples seeded rows from the global stream",
        "vllm_hetero_spec/verify/sampler.py",
        "sampling_metadata=replace(sampling_metadata, generators=keyed)",
        "sampling_metadata=replace(sampling_metadata, generators={})",
        ("tests/verify/test_sampler_adapter.py",),
    ),
    Mutation(
        "q-right-column", "q of a padded per-row support is read from the column right of the token",
        "vllm_hetero_spec/verify/draft_probs.py",
        "            col = torch.searchsorted(support, tokens.unsqueeze(1)).clamp(max=support.shape[1] - 1)",
        "            col = (torch.searchsorted(support, tokens.unsqueeze(1), right=True) - 1).clamp(\n"
        "                min=0, max=support.shape[1] - 1)",
        ("tests/verify/test_mixed_batch.py",),
    ),
    Mutation(
        "pad-first-id", "narrow q supports are padded with their first id instead of their last",
        "vllm_hetero_spec/verify/draft_probs.py",
        "support.append(torch.cat([p.support, p.support[:, -1:].expand(-1, pad)], dim=1))",
        "support.append(torch.cat([p.support, p.support[:, :1].expand(-1, pad)], dim=1))",
        ("tests/verify/test_mixed_batch.py",),
    ),
    Mutation(
        "grammar-json-only", "only JSON-schema requests are verified one-hot (regex, choice, grammar with q)",
        "vllm_hetero_spec/vllm_integration/batch_requests.py",
        "    return p is not None and p.structured_outputs is not None",
        "    return p is not None and p.structured_outputs is not None and p.structured_outputs.json is not None",
        ("tests/drafter/test_proposer_token_level.py", "-k", "structured"),
    ),
    Mutation(
        "draft-builders-under-target", "the drafter's metadata builders are made under whatever config is current",
        "vllm_hetero_spec/drafter/runtime/attention.py",
        "    with set_current_vllm_config(vllm_config):\n        for group in groups.values():",
        "    if groups:\n        for group in groups.values():",
        ("tests/drafter/test_attention_backends.py",),
    ),
    Mutation(
        "draft-seq-lens-readback", "the drafter's forwards hand no host lengths to the backend (FlashInfer reads them back)",
        "vllm_hetero_spec/drafter/runtime/attention.py",
        "        seq_lens_cpu_upper_bound=torch.from_numpy(host.seq_lens.copy()),\n",
        "",
        ("tests/drafter/test_attention_backends.py",),
    ),
    Mutation(
        "draft-rows-graph-capped", "the drafter's max_num_seqs is its largest graph size (FlashInfer refuses wider forwards)",
        "vllm_hetero_spec/drafter/runtime/model.py",
        "        max_num_seqs=cfg.max_forward_tokens,",
        "        max_num_seqs=min(cfg.max_forward_tokens, max(cfg.graph_sizes or (cfg.max_forward_tokens,))),",
        ("tests/drafter/test_attention_backends.py",),
    ),
    Mutation(
        "profile-top-k", "the drafter's profile samples with top-k 50 (a partial top-k, not the full sort top-p takes)",
        "vllm_hetero_spec/drafter/batch_drafter.py",
        "rows = SamplingRows.build([1.0] * n, [0] * n, [0.9] * n,",
        "rows = SamplingRows.build([1.0] * n, [50] * n, [0.9] * n,",
        ("tests/drafter/test_draft_loop_device.py", "-k", "profile"),
    ),
    Mutation(
        "profile-no-q-held", "the drafter's profile drops each position's q instead of holding it to the step's end",
        "vllm_hetero_spec/drafter/rules/base.py",
        "            if drawn.verify_q is not None:\n                q_parts.append(drawn.verify_q)\n",
        "",
        ("tests/drafter/test_draft_loop_device.py", "-k", "profile"),
    ),
    Mutation(
        "slrs-level-unsliced", "slrs evaluates a whole tree level in one forward however wide",
        "vllm_hetero_spec/drafter/rules/slrs/first_token.py",
        "            for part in _slices(grow, [len(fronts[i]) for i in grow], runtime.cfg.max_rows):",
        "            for part in [grow]:",
        ("tests/drafter/test_slrs.py", "-k", "slices"),
    ),
    Mutation(
        "prefill-steps-steady", "a step someone joined or prefilled in counts as steady (advise's log, the budget)",
        "vllm_hetero_spec/policy/step_log.py",
        "return set(req_ids) <= set(last_ids) and all(s > 0 for s in sampled)",
        "return True",
        ("tests/policy/test_step_log.py",),
    ),
    Mutation(
        "advise-flat-acceptance", "advise projects every reply from the sample's acceptance as a whole",
        "vllm_hetero_spec/advise/analysis.py",
        "projected_with = phases or acceptance",
        "projected_with = acceptance",
        ("tests/advise/test_analysis.py", "-k", "rises"),
    ),
    Mutation(
        "step-log-no-position", "the step log records every acceptance at the start of a reply",
        "vllm_hetero_spec/policy/step_log.py",
        "verified = tuple((self._emitted.get(r, 0), sent[r]",
        "verified = tuple((0, sent[r]",
        ("tests/policy/test_step_log.py",),
    ),
    Mutation(
        "advise-no-prefill-share", "advise projects decode steps alone, as if a run had no prefill",
        "vllm_hetero_spec/advise/analysis.py",
        'plain_run["wall_first"] / len(_groups(plain_run["lengths"], b)) / unit',
        "0.0",
        ("tests/advise/test_analysis.py",),
    ),
    Mutation(
        "advise-no-prompt-reading", "advise leaves out the drafter's reading of each prompt",
        "vllm_hetero_spec/advise/analysis.py",
        "reading / groups / unit)",
        "0.0)",
        ("tests/advise/test_analysis.py",),
    ),
    Mutation(
        "advise-recommends-a-tie", "advise writes a config where drafting only ties plain decoding",
        "vllm_hetero_spec/advise/analysis.py",
        "    if score <= 1.0:",
        "    if score < 1.0:",
        ("tests/advise/test_analysis.py",),
    ),
    Mutation(
        "id-map-drops-drafts", "the id map throws away the KV of the drafts the target accepted",
        "vllm_hetero_spec/vocab/id_map.py",
        "kept = self.n_committed + (int(differ[0]) if len(differ) else m)",
        "kept = self.n_committed",
        ("tests/vocab/test_id_map.py", "tests/drafter/test_id_map_drafting.py"),
    ),
    Mutation(
        "id-map-ignores-respelled", "the id map carries a respelled id as itself",
        "vllm_hetero_spec/vocab/id_map.py",
        "                out.extend(self.differing.get(t, (t,)))",
        "                out.append(t)",
        ("tests/vocab/test_id_map.py",),
    ),
    Mutation(
        "id-map-whole-vocabularies", "any pair counts as near-same",
        "vllm_hetero_spec/vocab/id_map.py",
        "        if not n_text or sum(target_bytes[t] is not None for t in differ) > allowed:",
        "        if not n_text:",
        ("tests/vocab/test_id_map.py",),
    ),
    Mutation(
        "head-drops-added-tokens", "a subset output layer leaves out the added tokens (end of turn among them)",
        "vllm_hetero_spec/vocab/frequent_tokens.py",
        "np.union1d(np.arange(min(n, vocab_size)), np.asarray(added, dtype=np.int64))",
        "np.arange(min(n, vocab_size))",
        ("tests/vocab/test_frequent_tokens.py",),
    ),
    Mutation(
        "head-zero-elsewhere", "a subset output layer gives the tokens it leaves out logit 0, not -inf",
        "vllm_hetero_spec/drafter/runtime/draft_head.py",
        'logits = hidden.new_full((hidden.shape[0], self.vocab_size), float("-inf"), dtype=torch.float32)',
        'logits = hidden.new_full((hidden.shape[0], self.vocab_size), 0.0, dtype=torch.float32)',
        ("tests/drafter/test_drafter_runtime.py", "-k", "subset_head"),
    ),
    Mutation(
        "head-any-order", "any tokenizer counts as ranked by id",
        "vllm_hetero_spec/vocab/frequent_tokens.py",
        "    return min(ids) >= 0 and all(b > a for a, b in zip(ids, ids[1:]))",
        "    return min(ids) >= 0",
        ("tests/vocab/test_frequent_tokens.py",),
    ),
    Mutation(
        "bonus-min-tokens", "the bonus row's min_tokens counts committed outputs only, not the step's drafts",
        "vllm_hetero_spec/verify/sampler.py",
        "                logitsprocs=bonus_logits_processors(sampling_metadata.logitsprocs, num_draft),\n",
        "",
        ("tests/verify/test_output_so_far.py", "-k", "min_tokens"),
    ),
    Mutation(
        "seed-shift", "a seeded token's generator mixes seed and position additively (n > 1 children shift-copy)",
        "vllm_hetero_spec/verify/seeded.py",
        "    return _splitmix64(_splitmix64(seed & _MASK64) ^ position) >> 1",
        "    return _splitmix64((seed + position) & _MASK64) >> 1",
        ("tests/verify/test_sampler_adapter.py", "-k", "children"),
    ),
    Mutation(
        "tie-last", "a greedy row's exact tie goes to the last of the tied tokens, not the one vLLM's argmax takes",
        "vllm_hetero_spec/verify/sampler.py",
        "target_choice = None if sampling_metadata.all_random else target_logits.argmax(dim=-1)",
        "target_choice = None if sampling_metadata.all_random else "
        "(target_logits.shape[-1] - 1 - target_logits.flip(-1).argmax(dim=-1))",
        ("tests/verify/test_sampler_adapter.py", "-k", "tie"),
    ),
    Mutation(
        "order-bias-after-penalties", "logit_bias added after the penalties at the drafted rows",
        "vllm_hetero_spec/verify/sampler.py",
        '        target_logits = add_logit_bias(target_logits, sampling_metadata.logitsprocs, num_draft)\n        target_logits = self.apply_logits_processors(target_logits, sampling_metadata, metadata)\n',
        '        target_logits = self.apply_logits_processors(target_logits, sampling_metadata, metadata)\n        target_logits = add_logit_bias(target_logits, sampling_metadata.logitsprocs, num_draft)\n',
        ("tests/verify/test_transform_order.py", "-k", "first_drafted"),
    ),
    Mutation(
        "order-penalties-after-temperature", "the penalties applied after temperature, min_p and the filters",
        "vllm_hetero_spec/verify/sampler.py",
        "        target_logits = self.apply_logits_processors(target_logits, sampling_metadata, metadata)\n        # Greedy rows (and seeded ones, below) are verified by equality with the target's token.\n        target_choice = None if sampling_metadata.all_random else target_logits.argmax(dim=-1)\n        min_p = min_p_rows(sampling_metadata.logitsprocs, metadata.cu_num_draft_tokens, target_logits.shape[0])\n        target_logits = constrain(target_logits, metadata.cu_num_draft_tokens, sampling_metadata, min_p)\n",
        "        # Greedy rows (and seeded ones, below) are verified by equality with the target's token.\n        target_choice = None if sampling_metadata.all_random else target_logits.argmax(dim=-1)\n        min_p = min_p_rows(sampling_metadata.logitsprocs, metadata.cu_num_draft_tokens, target_logits.shape[0])\n        target_logits = constrain(target_logits, metadata.cu_num_draft_tokens, sampling_metadata, min_p)\n        target_logits = self.apply_logits_processors(target_logits, sampling_metadata, metadata)\n",
        ("tests/verify/test_transform_order.py", "-k", "first_drafted"),
    ),
    Mutation(
        "order-bias-last", "logit_bias added after temperature, min_p and the filters",
        "vllm_hetero_spec/verify/sampler.py",
        "        target_logits = add_logit_bias(target_logits, sampling_metadata.logitsprocs, num_draft)\n        target_logits = self.apply_logits_processors(target_logits, sampling_metadata, metadata)\n        # Greedy rows (and seeded ones, below) are verified by equality with the target's token.\n        target_choice = None if sampling_metadata.all_random else target_logits.argmax(dim=-1)\n        min_p = min_p_rows(sampling_metadata.logitsprocs, metadata.cu_num_draft_tokens, target_logits.shape[0])\n        target_logits = constrain(target_logits, metadata.cu_num_draft_tokens, sampling_metadata, min_p)\n",
        "        target_logits = self.apply_logits_processors(target_logits, sampling_metadata, metadata)\n        # Greedy rows (and seeded ones, below) are verified by equality with the target's token.\n        target_choice = None if sampling_metadata.all_random else target_logits.argmax(dim=-1)\n        min_p = min_p_rows(sampling_metadata.logitsprocs, metadata.cu_num_draft_tokens, target_logits.shape[0])\n        target_logits = constrain(target_logits, metadata.cu_num_draft_tokens, sampling_metadata, min_p)\n        target_logits = add_logit_bias(target_logits, sampling_metadata.logitsprocs, num_draft)\n",
        ("tests/verify/test_transform_order.py", "-k", "first_drafted"),
    ),
    Mutation(
        "order-min-p-before-temperature", "min_p applied to the untempered law",
        "vllm_hetero_spec/verify/target_constraints.py",
        "    logits.div_(temperature.unsqueeze(-1))\n    if min_p is not None:\n        apply_min_p(logits, min_p)\n",
        "    if min_p is not None:\n        apply_min_p(logits, min_p)\n    logits.div_(temperature.unsqueeze(-1))\n",
        ("tests/verify/test_transform_order.py", "-k", "first_drafted"),
    ),
    Mutation(
        "order-top-p-before-top-k", "verification's top-p cut taken over the whole law, then top-k",
        "vllm_hetero_spec/verify/top_k_top_p.py",
        "    ascending = ascending.masked_fill(ascending < kth, float(\"-inf\"))\n"
        "    below = ascending.softmax(dim=-1).cumsum(dim=-1)  # [rows, k_max] mass up to and including each\n",
        "    full = (ascending - logits.logsumexp(dim=-1, keepdim=True)).exp()\n"
        "    below = (1 - full.sum(dim=-1, keepdim=True)) + full.cumsum(dim=-1)\n"
        "    ascending = ascending.masked_fill(ascending < kth, float(\"-inf\"))\n",
        ("tests/verify/test_top_k_top_p.py",),
    ),
]


def run(mutation: Mutation) -> tuple[bool, float]:
    """Apply ``mutation`` in a scratch copy; True when its tests fail (caught)."""
    with tempfile.TemporaryDirectory() as tmp:
        scratch = Path(tmp)
        shutil.copytree(ROOT / "vllm_hetero_spec", scratch / "vllm_hetero_spec")
        shutil.copytree(ROOT / "tests", scratch / "tests")
        shutil.copy(ROOT / "pyproject.toml", scratch / "pyproject.toml")
        target = scratch / mutation.path
        text = target.read_text()
        if text.count(mutation.old) != 1:
            raise SystemExit(f"{mutation.name}: the code to mutate is not (uniquely) in {mutation.path}; update me")
        target.write_text(text.replace(mutation.old, mutation.new))
        env = {**os.environ, "PYTHONPATH": str(scratch), "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
               "TOKENIZERS_PARALLELISM": "false"}
        t0 = time.monotonic()
        proc = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", *mutation.tests],
            cwd=scratch, env=env, capture_output=True, text=True,
        )
        return proc.returncode != 0, time.monotonic() - t0


def main() -> None:
    wanted = set(sys.argv[1:])
    chosen = [m for m in MUTATIONS if not wanted or m.name in wanted]
    missed = []
    for m in chosen:
        caught, seconds = run(m)
        print(f"{m.name:10s} {'caught' if caught else 'MISSED':7s} {seconds:6.1f}s  {m.what}  [{' '.join(m.tests)}]")
        if not caught:
            missed.append(m.name)
    if missed:
        raise SystemExit(f"not caught: {', '.join(missed)}")


if __name__ == "__main__":
    main()
