"""The e2e pass's cost, declared per module: what each may start and sample.

``tests/conftest.py`` counts what every module actually starts (engine starts by kind,
``vllm serve`` processes, through ``hetero_harness/cost_ledger.py``; the rows statistical
tests declare) and fails the run, naming the module and the count, where a module
exceeds its line here or starts an engine without one. Counts, not seconds: they do not
move with the machine's speed. A new test rides an engine that already runs, or raises
its module's line here, where the total is checked against the pass's budget
(``tests/plugin/test_cost_budget.py``).

``compiled`` counts starts with torch.compile whether they compile or load the compile
cache (on a clean machine the first engine of a configuration compiles and later ones
load it, and which is first depends on what ran before); the printed table tells the two
apart.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Budget:
    compiled: int = 0  # engine starts with torch.compile (fresh or from the compile cache)
    eager: int = 0  # engine starts with enforce_eager
    serve: int = 0  # `vllm serve` processes (their engines count above too)
    rows: int = 0  # rows sampled by statistical tests

    @property
    def engines(self) -> int:
        return self.compiled + self.eager


#: Per module (path under tests/), and per session fixture shared by several modules.
BUDGET: dict[str, Budget] = {
    # Gemma-3-270M alone: the reference of every module of the Gemma pair (rules, Ray,
    # lifecycle, TP, data-parallel serving): greedy and long greedy rows, and the sampled
    # laws (T = 1, constrained, and the control at T = 0.5).
    "e2e/conftest.py::gemma_alone": Budget(eager=1, rows=540),
    # Every lossless rule in two engines of half the cases each (requests name their rule);
    # 8 sampled groups of 60.
    "e2e/test_e2e_rules.py": Budget(eager=2, rows=480),
    # advise's plain, hetero and draft_model engines, measured eager (--enforce-eager).
    "e2e/test_advise.py": Budget(eager=3),
    "e2e/test_batch_schedule.py": Budget(eager=1),
    # The lifecycle-and-preemption engine, drafting with fsd: fsd's 60 sampled rows.
    "e2e/test_lifecycle.py": Budget(eager=1, rows=60),
    # The Ray job's engine: union in a Ray actor, faults, and 60 sampled rows.
    "e2e/test_ray_executor.py": Budget(eager=1, rows=60),
    # The README's offline run and its `vllm serve`, as pasted.
    "e2e/test_readme_commands.py": Budget(compiled=2, serve=1),
    # The shared plain server (the reference of every serving module) and the documented one,
    # both on the README server's flags: they load its compile (the table's "from the cache").
    "e2e/test_serving.py": Budget(compiled=2, serve=2),
    # One data-parallel server of the Gemma pair: two engines, eager.
    "e2e/test_serving_scale.py": Budget(eager=2, serve=1),
    # TP = 2 with the drafter in process (in a Ray actor: given up, the module's docstring).
    "e2e/test_tensor_parallel.py": Budget(eager=1),
}

#: The whole e2e pass (docs/testing.md, "Where the time goes": what these counts cost).
TOTAL = Budget(compiled=4, eager=12, serve=4, rows=1140)
