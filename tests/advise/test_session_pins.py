"""A pinned run of ``advise``'s session measures what its pin asks: the prompts, batch
size and length. The engine is left out (``generate`` records its calls): plumbing only;
the e2e suite runs sessions on real engines."""

from __future__ import annotations

from vllm_hetero_spec.advise.session import Session


class _Recorded(Session):
    def __init__(self, job: dict, n: int):  # no engine: the calls are what is tested
        self.job, self.hetero, self.prompts = job, False, [f"p{i}" for i in range(n)]
        self.total, self.done, self.calls = 0, 0, []

    def generate(self, indices: list[int], batch: int, temperature: float, max_tokens: int) -> tuple[float, list[int]]:
        self.calls.append((list(indices), batch, max_tokens))
        return 1.0, [max_tokens] * len(indices)

    def warm_up(self) -> None:
        pass

    def tick(self) -> None:
        pass


def test_a_pin_with_prompts_runs_the_first_that_many_and_one_without_runs_all() -> None:
    job = {"kind": "plain", "first_token": False, "max_tokens": 64, "k": 4,
           "pins": [{"T": 0.0, "b": 1, "max_tokens": 256, "prompts": 3, "round": 1}, {"T": 0.0, "b": 8}]}
    session = _Recorded(job, 8)
    out = session.run()
    assert session.calls == [([0, 1, 2], 1, 256), (list(range(8)), 8, 64)]
    assert [(r["b"], r["max_tokens"], r["lengths"], r["round"]) for r in out["runs"]] == [
        (1, 256, [256] * 3, 1), (8, 64, [64] * 8, 0)]
