"""Executors run the tenant's image: the operator's scrape of their /metrics is bounded and refuses what is
not the exposition format, skipping the period with a reason instead of failing (loopback servers)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from streamtopo.controller.platform import MetricsUnavailable
from streamtopo.controller.scrape import MAX_SCRAPE_BYTES, ScrapeMetricsSource

GOOD = b'streamtopo_unit_busy_seconds_total{topology="t",executor="t-e0",operator="a",kg="0"} 1.5\n'


@contextmanager
def serving(body: bytes) -> Iterator[str]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/metrics"
    finally:
        server.shutdown()
        server.server_close()


def test_a_well_formed_scrape_is_read() -> None:
    with serving(GOOD) as url:
        samples = ScrapeMetricsSource({"t-e0": url}).scrape("t")
    assert list(samples["t-e0"].values()) == [1.5]


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (b"#" * (MAX_SCRAPE_BYTES + 1), "ScrapeTooLarge"),
        (b"\xff\xfe not text", "ScrapeInvalid"),
        (b"streamtopo_unit_busy_seconds_total{topology= 1 2 3\n", "ScrapeInvalid"),
    ],
    ids=["too-large", "not-utf8", "not-exposition"],
)
def test_a_hostile_scrape_skips_the_period_with_a_reason(body: bytes, reason: str) -> None:
    with serving(body) as url, pytest.raises(MetricsUnavailable) as info:
        ScrapeMetricsSource({"t-e0": url}).scrape("t")
    assert info.value.reason == reason and "t-e0" in str(info.value)
