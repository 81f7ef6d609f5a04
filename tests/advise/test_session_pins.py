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


def test_served_prompts_run_one_at_a_time_per_temperature_before_the_runs() -> None:
    """A job's ``served`` prompts warm the engine as a server's earlier requests do: each
    temperature, one request at a time, to the job's longest output, before any timed
    pass; the sample's own prompts are not among them."""
    class _Served(_Recorded):
        warm_up = Session.warm_up

        def generate(self, indices, batch, temperature, max_tokens, prompts=None):
            self.calls.append((prompts, list(indices), batch, temperature, max_tokens))
            return 1.0, [max_tokens] * len(indices)

    job = {"kind": "plain", "first_token": False, "max_tokens": 64, "k": 4, "batch_sizes": [1],
           "temperatures": [0.0, 1.0], "pins": [{"T": 0.0, "b": 1}]}
    session = _Served(job, 2)
    session.served = ["s0", "s1"]
    session.run()
    served = [c for c in session.calls if c[0] is not None]
    assert served == [(["s0", "s1"], [0, 1], 1, 0.0, 64), (["s0", "s1"], [0, 1], 1, 1.0, 64)]
    assert session.calls.index(served[-1]) < len(session.calls) - 1  # the timed run comes after
    assert session.calls[-1] == (None, [0, 1], 1, 0.0, 64)
