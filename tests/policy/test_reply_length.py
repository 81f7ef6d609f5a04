"""What a request can expect to emit still, from the replies that ended."""

from __future__ import annotations

import pytest

from vllm_hetero_spec.policy.reply_length import ReplyLengths


def test_to_go_is_what_longer_replies_ran_beyond_a_request_s_output() -> None:
    replies = ReplyLengths(least=2)
    assert replies.to_go(["a"]) == [None]  # nothing ended yet
    for i, n in enumerate((100, 200, 300, 40)):
        replies.add([f"r{i}"], [n])
        replies.end(f"r{i}")
    replies.add(["a", "b", "c"], [50, 250, 0])
    to_go = replies.to_go(["a", "b", "c", "new"])
    assert to_go[0] == pytest.approx((50 + 150 + 250) / 3)  # 100, 200 and 300 ran past 50; 40 did not
    assert to_go[1] is None  # only one reply ran past 250: too few to say
    assert to_go[2] == to_go[3] == pytest.approx((100 + 200 + 300 + 40) / 4)


def test_only_the_last_replies_count_and_an_empty_one_is_not_a_reply() -> None:
    replies = ReplyLengths(keep=2, least=1)
    for i, n in enumerate((1000, 10, 20)):
        replies.add([f"r{i}"], [n])
        replies.end(f"r{i}")
    replies.end("never-emitted")
    replies.add(["x", "y"], [3, 0])  # a row still prefilling emits nothing
    assert list(replies.ended) == [10, 20]
    assert replies.to_go(["y"]) == [pytest.approx(15.0)]
