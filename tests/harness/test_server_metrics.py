"""ServerProcess's /metrics readers, against a local HTTP server that serves a
Prometheus text page (the serving tests and the soak depend on them reading it right)."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from hetero_harness.server_process import ServerProcess

PAGE = """# HELP vllm:spec_decode_num_draft_tokens_total Draft tokens.
# TYPE vllm:spec_decode_num_draft_tokens_total counter
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="m"} 12.0
vllm:spec_decode_num_draft_tokens_total{engine="1",model_name="m"} 30.0
vllm:spec_decode_num_draft_tokens_created{engine="0",model_name="m"} 1.7e9
hetero:request_states{algorithm="auto"} STATES
hetero:draft_pool_bytes 0.0
"""


@pytest.fixture
def server(tmp_path: Path):
    """A ServerProcess pointed at a local page whose ``hetero:request_states`` reads
    ``state["states"]``."""
    state = {"states": 3.0}

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = PAGE.replace("STATES", str(state["states"])).encode()
            self.send_response(200)
            self.send_header("content-type", "text/plain")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    proc = ServerProcess("m", [], tmp_path / "log")
    proc.port = httpd.server_address[1]
    yield proc, state
    httpd.shutdown()


def test_metric_sum_and_by_label(server) -> None:
    proc, _ = server
    assert proc.metric_sum("vllm:spec_decode_num_draft_tokens_total") == 42.0  # not the _created sample
    assert proc.metric_by_label("vllm:spec_decode_num_draft_tokens_total", "engine") == {"0": 12.0, "1": 30.0}
    assert proc.metric_by_label("hetero:draft_pool_bytes", "engine") == {"": 0.0}
    assert proc.metric_by_label("absent", "engine") == {}


def test_wait_for_metrics_returns_once_every_value_is_reached(server) -> None:
    proc, state = server
    threading.Timer(1.0, lambda: state.update(states=0.0)).start()
    want = {"hetero:request_states": 0.0, "hetero:draft_pool_bytes": 0.0}
    assert proc.wait_for_metrics(want, timeout=20) == want


def test_wait_for_metrics_gives_the_last_reading_after_the_timeout(server) -> None:
    proc, _ = server
    assert proc.wait_for_metrics({"hetero:request_states": 0.0}, timeout=1) == {"hetero:request_states": 3.0}
