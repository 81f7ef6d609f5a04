"""The proposer's step log: the target's time between proposals, the positions it
verified, and which steps are steady (nobody joined, nobody prefilling)."""

from __future__ import annotations

from vllm_hetero_spec.policy.step_log import StepLog


def test_the_log_times_the_target_between_proposals_and_marks_steady_steps() -> None:
    log = StepLog()
    log.add(0.0, 0.1, ["a", "b"], [0, 0], [3, 3])  # both just prefilled: nothing to time yet
    log.add(1.1, 1.3, ["a", "b"], [2, 4], [3, 3])  # verified 2 rows + 6 drafts in 1.0 s
    log.add(2.0, 2.1, ["a", "b", "c"], [1, 1, 0], [2, 2, 0])  # c joined: not steady
    log.add(2.6, 2.6, ["a"], [3], [0])  # b and c finished: steady (nobody joined)
    assert [(s.rows, s.tokens, s.steady) for s in log.steps] == [
        (2, 0, False), (2, 8, True), (3, 8, False), (1, 7, True)]
    assert [round(s.target_s, 6) for s in log.steps] == [0.0, 1.0, 0.7, 0.5]
    assert [round(s.propose_s, 6) for s in log.steps] == [0.1, 0.2, 0.1, 0.0]
    log.clear()
    log.add(5.0, 5.1, ["a"], [1], [1])
    # the first step after a clear: its proposal counts, its target step was not seen
    assert [(s.tokens, s.target_s, s.steady) for s in log.steps] == [(0, 0.0, False)]


def test_the_log_records_what_each_row_accepted_at_which_output_position() -> None:
    """Per row sent drafts: its output tokens before the step, the drafts, and what it
    accepted (sampled less the one token the target adds); a prefilling row and a row
    sent nothing record nothing, and a newcomer starts at position 0."""
    log = StepLog()
    log.add(0.0, 0.1, ["a", "b"], [1, 1], [3, 2])  # both prefilled: 1 token out each
    log.add(1.0, 1.1, ["a", "b", "c"], [4, 1, 0], [3, 0, 0])  # a accepted 3 of 3, b 0 of 2; c prefilling
    log.add(2.0, 2.1, ["a", "b", "c"], [2, 1, 1], [1, 2, 2])  # a accepted 1 of 3; b and c were sent nothing
    log.add(3.0, 3.1, ["a", "c"], [1, 3], [0, 0])  # a accepted 0 of 1, c 2 of 2 at its position 1
    assert [s.verified for s in log.steps] == [(), ((1, 3, 3), (1, 2, 0)), ((5, 3, 1),), ((7, 1, 0), (1, 2, 2))]
    log.clear()
    log.add(5.0, 5.1, ["a"], [1], [1])
    log.add(6.0, 6.1, ["a"], [2], [1])
    assert log.steps[-1].verified == ((1, 1, 1),)  # positions count again from the clear
