"""The Gemma pair's requests (SmolLM2-135M drafting for Gemma-3-270M) and the target
alone's reference, shared by the modules that run this pair.

A group of requests (:class:`Rows`) is one kind of row: greedy bridge-stress prompts,
``count`` unseeded copies of one prompt sampled at T > 0 with vLLM's filters, seeded
requests, or long greedy rows. :func:`job` turns a list of groups into one engine's job
(``hetero_harness.evaluation.run_job``) and :func:`split` cuts its result back into
groups. The target alone runs every group its users compare with in one engine
(:data:`REFERENCE_ROWS`), once per session (``conftest.gemma_alone``): the rules'
module, the Ray module and the lifecycle module each used to start their own.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

from transformers import AutoTokenizer

from hetero_harness.prompts import BRIDGE_STRESS

#: The cost ledger's line for the target alone's engine (tests/cost_budget.py): shared by
#: the modules of this pair, it is charged to none of them.
GEMMA_ALONE = "e2e/conftest.py::gemma_alone"
#: The pair's engines run in process, an extra configuration like their enforce_eager:
#: what they show (each rule's exactness) does not depend on the process layout, and the
#: engine core's own process, sharing its pinned core with the caller, made every engine
#: slower. vLLM's default layout runs the shipped config in test_serving.py and
#: test_readme_commands.py.
IN_PROCESS = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
#: Sampled rows per configuration (distribution tests, :mod:`_stats`; their power:
#: test_e2e_rules.py's docstring).
N = 60
#: The target alone's sampled rows per law: four configurations' worth.
N_REF = 4 * N
PROMPT = "My favourite thing about the weekend is"
FILTERS = {"top_k": 40, "top_p": 0.95}
GREEDY_TOKENS = 24
SEEDED_TOKENS = 16
SEEDS = [7, 8, 9, 10]
# A JSON string of lowercase letters and spaces: many of the drafter's tokens (capitals,
# punctuation, newlines) are invalid, so vLLM cuts drafts often (verified one-hot).
SCHEMA = {"type": "string", "pattern": "^[a-z ]+$"}


@dataclass(frozen=True)
class Rows:
    """A group of requests in one engine: ``count`` copies of the sampled prompt at
    ``temperature`` (3 tokens; seeded: the first ``count`` bridge-stress prompts,
    :data:`SEEDED_TOKENS` each), or (``greedy``) the bridge-stress prompts, the first
    ``count`` of them where it is set, :data:`GREEDY_TOKENS` each unless ``tokens``."""

    name: str
    count: int = 0
    temperature: float = 1.0
    schema: dict | None = None
    greedy: bool = False
    seeded: bool = False
    tokens: int = 0

    @property
    def max_tokens(self) -> int:
        return self.tokens or (GREEDY_TOKENS if self.greedy else SEEDED_TOKENS if self.seeded else 3)

    @property
    def request_temperature(self) -> float:
        return 0.0 if self.greedy else self.temperature

    def seeds(self, n: int) -> list[int | None]:
        """The seeds of this group's ``n`` requests: only seeded groups have any."""
        return SEEDS[:n] if self.seeded else [None] * n


GREEDY = Rows("greedy", greedy=True)
SAMPLED, JSON = Rows("sampled", N), Rows("json", N, schema=SCHEMA)
SEEDED = Rows("seeded", 4, seeded=True)
#: The lifecycle module's preemption half: four greedy rows of 140 tokens.
PREEMPT = Rows("preempt", 4, greedy=True, tokens=140)
#: The data-parallel server's requests (up to 32 tokens of each stress prompt).
LONG_GREEDY = Rows("long greedy", greedy=True, tokens=32)
#: What the target alone runs for every module of this pair: the greedy rows, each law
#: the sampled rows are compared with (T = 1, the constrained one, and the control at
#: T = 0.5), the preemption rows and the data-parallel server's.
REFERENCE_ROWS = (GREEDY, Rows("sampled", N_REF), Rows("control", N, temperature=0.5),
                  Rows("json", N_REF, schema=SCHEMA), PREEMPT, LONG_GREEDY)

#: fsd at tau = 0 with its output layer over SmolLM2's 16384 most frequent tokens: a q that
#: is 0 on two thirds of the vocabulary must still verify exactly. A setting of the engine,
#: so it rides the lifecycle engine (lifecycle_job.py) rather than a rules engine.
FSD = {"algorithm": "fsd", "fsd_threshold": 0.0, "draft_head_tokens": 16384}

#: One group in one engine: (case, the rule its requests name or None, rows).
Group = tuple[str, "str | None", Rows]


@lru_cache(maxsize=None)
def prompts(gemma: str) -> dict[str, list]:
    """Token-id prompts, tokenized once: engines without structured outputs load no vLLM
    tokenizer (Gemma-3's 262k-token tokenizer cost an engine about 18 s on one core)."""
    tok = AutoTokenizer.from_pretrained(gemma)
    return {"sampled": tok(PROMPT).input_ids, "greedy": [tok(p).input_ids for p in BRIDGE_STRESS]}


def group_prompts(group: Rows, ids: dict[str, list]) -> list[list[int]]:
    """The token-id prompts of ``group``'s requests."""
    if group.seeded or group.greedy:
        return ids["greedy"][: group.count or None]
    return [ids["sampled"]] * group.count


def job(target: str, ids: dict[str, list], groups: list[Group], spec: dict | None,
        solo_cases: tuple[str, ...] = ()) -> dict:
    """One engine's requests: each of ``groups`` in order (greedy before sampled, so that
    greedy rows share their steps with sampled ones), each request naming its case's rule
    where it has one; only the seeded groups have seeds (the others draw from the
    engine's stream: a seeded row is verified by equality with its seeded sample, and the
    distribution tests are there to test the rules' acceptance); the seeded requests of
    ``solo_cases`` also run one at a time after the batch."""
    prompt_ids, temps, schemas, lengths, seeds, params, solo = [], [], [], [], [], [], []
    for case, rule, group in groups:
        batch = group_prompts(group, ids)
        if group.seeded and case in solo_cases:
            solo += range(len(prompt_ids), len(prompt_ids) + len(batch))
        prompt_ids += batch
        temps += [group.request_temperature] * len(batch)
        schemas += [group.schema] * len(batch)
        lengths += [group.max_tokens] * len(batch)
        seeds += group.seeds(len(batch))
        params += [{"extra_args": {"algorithm": rule}} if rule else {}] * len(batch)
    structured = any(group.schema for _, _, group in groups)
    return {
        "target": target,
        "prompts": prompt_ids,
        "request_seeds": seeds,
        "solo": solo,
        "max_tokens": lengths,
        "temperatures": temps,
        "json_schemas": schemas,
        "params": params,
        # Structured outputs need vLLM's tokenizer (the grammar is compiled over it).
        "skip_tokenizer_init": not structured,
        "ignore_eos": True,
        "max_model_len": 256,
        "max_num_seqs": 64,
        "speculative_config": spec,
        "warmup": False,
        "enforce_eager": True,  # start sooner; default flags: test_serving, test_readme_commands
        **FILTERS,
    }


def split(result: dict | Exception, groups: list[Group], ids: dict[str, list],
          solo: list[int]) -> dict[str, dict[str, dict | Exception]]:
    """``result`` cut into one result per case and group: ``{case: {rows name: result}}``;
    a case's seeded rows run alone come as ``solo_token_ids``."""
    out: dict[str, dict[str, dict | Exception]] = {}
    solo_start = 0
    for (case, _, group), (start, n) in zip(groups, spans([g for _, _, g in groups], ids)):
        if isinstance(result, Exception):
            out.setdefault(case, {})[group.name] = result
            continue
        part = {**result, "token_ids": result["token_ids"][start:start + n], "solo_token_ids": []}
        if start in solo:
            part["solo_token_ids"] = result["solo_token_ids"][solo_start:solo_start + n]
            solo_start += n
        out.setdefault(case, {})[group.name] = part
    return out


def spans(groups: Sequence[Rows], ids: dict[str, list]) -> list[tuple[int, int]]:
    """(first request, request count) of each of ``groups`` in a batch of all of them, in order."""
    out, start = [], 0
    for group in groups:
        n = len(group_prompts(group, ids))
        out.append((start, n))
        start += n
    return out


def reference_job(gemma: str) -> tuple[dict, list[Group]]:
    """The target alone's job, and its groups (case ``target``)."""
    groups: list[Group] = [("target", None, group) for group in REFERENCE_ROWS]
    return job(gemma, prompts(gemma), groups, None), groups


def sampled_rows(groups: list[Group]) -> int:
    """Rows sampled for distribution tests among ``groups`` (the cost ledger's rows)."""
    return sum(g.count for _, _, g in groups if not g.greedy and not g.seeded)


def engine_rows(groups: tuple[Rows, ...], ids: dict[str, list]) -> tuple[list[list[int]], list]:
    """The token-id prompts of ``groups`` and their ``vllm.SamplingParams``, as :func:`job`
    sets them, for a job that drives its engine itself (``ray_job.py``, ``lifecycle_job.py``)."""
    from vllm import SamplingParams

    rows, params = [], []
    for group in groups:
        batch = group_prompts(group, ids)
        rows += batch
        params += [SamplingParams(temperature=group.request_temperature, seed=seed, max_tokens=group.max_tokens,
                                  ignore_eos=True, **FILTERS) for seed in group.seeds(len(batch))]
    return rows, params
