"""`source: prometheus`: the same counters read through a Prometheus server's query API.

No Prometheus server runs here, so `PromStandIn` is a small loopback FastAPI stand-in of
Prometheus' `GET /api/v1/query`: it understands exactly the instant-vector query the daemon
sends (`sum by (depth, bs_bucket) (<family>_total{matchers})`, a tree family's by `shape`),
evaluated over the latest
scrape of a real simulated server's /metrics text (as Prometheus would hold it, with an
`instance` label added), and answers in Prometheus' JSON shape.
"""

from __future__ import annotations

import re
from typing import Any

from fastapi import FastAPI
from fastapi.responses import JSONResponse
from prometheus_client.parser import text_string_to_metric_families
from test_daemon_http import Loopback, controller_for, new_sim

from sims.http import create_app
from sims.server import SimulatedServer

QUERY = re.compile(r"^sum by \((depth|shape), bs_bucket\) \((\w+)\{(.*)\}\)$")
MATCHER = re.compile(r'(\w+)="([^"]*)"')


class PromStandIn:
    def __init__(self, sim: SimulatedServer, instance: str) -> None:
        self.sim = sim
        self.instance = instance
        self.queries: list[str] = []
        app = FastAPI()

        @app.get("/api/v1/query")
        async def query(query: str) -> JSONResponse:
            self.queries.append(query)
            m = QUERY.match(query)
            if m is None:
                return JSONResponse(
                    status_code=400,
                    content={"status": "error", "errorType": "bad_data", "error": "parse error"},
                )
            return JSONResponse(
                content={
                    "status": "success",
                    "data": {"resultType": "vector", "result": self.evaluate(*m.groups())},
                }
            )

        self.app = app

    def evaluate(self, arm: str, sample_name: str, matchers: str) -> list[dict[str, Any]]:
        want = dict(MATCHER.findall(matchers))
        sums: dict[tuple[str, str], float] = {}
        for fam in text_string_to_metric_families(self.sim.metrics_text()):
            for s in fam.samples:
                labels = {**s.labels, "instance": self.instance}
                if s.name != sample_name or any(labels.get(k) != v for k, v in want.items()):
                    continue
                key = (labels[arm], labels["bs_bucket"])
                sums[key] = sums.get(key, 0.0) + s.value
        return [
            {"metric": {arm: d, "bs_bucket": b}, "value": [1.0, repr(v)]}
            for (d, b), v in sorted(sums.items())
        ]


def test_prometheus_source_stores_the_same_samples_as_scraping(tmp_path):
    sim = new_sim(concurrency=16)
    server_lb = Loopback(create_app(sim)).start()
    prom = PromStandIn(sim, instance="sim:30000")
    prom_lb = Loopback(prom.app).start()
    try:
        direct, direct_store = controller_for(tmp_path / "d", [{"name": "a", "url": server_lb.url}])
        via, via_store = controller_for(
            tmp_path / "p",
            [
                {
                    "name": "a",
                    "url": server_lb.url,
                    "source": "prometheus",
                    "prometheus_url": prom_lb.url,
                    "prometheus_selector": 'instance="sim:30000"',
                }
            ],
        )
        sim.advance(20)
        for now in (0.0, 10.0, 20.0):
            direct.scrape("a", now)
            via.scrape("a", now)
            sim.advance(15)
        a = [(s.depth, s.bs_bucket, s.tokens, s.iterations) for _, s in direct_store.samples()]
        b = [(s.depth, s.bs_bucket, s.tokens, s.iterations) for _, s in via_store.samples()]
        assert a and a == b
        assert any('instance="sim:30000"' in q and 'tp_rank="0"' in q for q in prom.queries)

        wrong, _ = controller_for(
            tmp_path / "w",
            [
                {
                    "name": "a",
                    "url": server_lb.url,
                    "source": "prometheus",
                    "prometheus_url": prom_lb.url,
                    "prometheus_selector": 'instance="other:1"',
                }
            ],
        )
        assert wrong.scrape("a", 0.0) == []
        assert wrong.metrics.scrape_errors.labels("a", "no_series")._value.get() == 1
        for c in (direct, via, wrong):
            c.close()
    finally:
        server_lb.stop()
        prom_lb.stop()
