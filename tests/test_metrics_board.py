"""The hetero:* metrics path: worker slots in a memory-mapped file, read at scrape time."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest

from vllm_hetero_spec.metrics import COUNTERS, GAUGES, BoardCollector, MetricsBoard, read_boards


def test_board_values_reach_the_exposition(tmp_path) -> None:
    board = MetricsBoard({"algorithm": "tli", "k": "4"}, tmp_path)
    board.add("steps", 3)
    board.add("steps", 2)
    board.set("request_states", 7)
    board.set("bridge_seconds", 0.25)
    (labels, values), = read_boards(tmp_path)
    assert labels["algorithm"] == "tli" and labels["pid"].isdigit()
    assert values["steps"] == 5 and values["request_states"] == 7 and values["fallbacks"] == 0
    registry = CollectorRegistry()
    registry.register(BoardCollector(tmp_path))
    text = generate_latest(registry).decode()
    assert 'hetero:steps_total{algorithm="tli",k="4",pid="' in text
    assert all(f"hetero:{name}_total" in text for name in COUNTERS)
    assert all(f"# TYPE hetero:{name} gauge" in text for name in GAUGES)
    board.set("request_states", 0)
    (_, values), = read_boards(tmp_path)
    assert values["request_states"] == 0


def test_half_written_boards_are_skipped(tmp_path) -> None:
    (tmp_path / "worker-1.json").write_text("{not json")
    (tmp_path / "worker-2.json").write_text('{"labels": {}, "slots": ["steps", "fallbacks"]}')
    (tmp_path / "worker-2.bin").write_bytes(b"\0" * 8)
    assert read_boards(tmp_path) == []
