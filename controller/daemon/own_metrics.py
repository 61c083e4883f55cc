"""The daemon's own /metrics (its own registry, so two daemons in one process do not clash)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest, start_http_server


class DaemonMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.scrapes = Counter(
            "specctl_daemon_scrapes", "Successful scrapes", ["target"], registry=r
        )
        self.scrape_errors = Counter(
            "specctl_daemon_scrape_errors",
            "Scrapes that yielded nothing storable, by kind",
            ["target", "kind"],
            registry=r,
        )
        self.dropped_series = Counter(
            "specctl_daemon_dropped_series",
            "Series or (depth, bucket) groups dropped as garbage (NaN, negative, impossible)",
            ["target"],
            registry=r,
        )
        self.counter_resets = Counter(
            "specctl_daemon_counter_resets",
            "Server restarts detected from counters going down",
            ["target"],
            registry=r,
        )
        self.samples_stored = Counter(
            "specctl_daemon_samples_stored", "Samples written to the store", ["target"], registry=r
        )
        self.fits = Counter("specctl_daemon_fits", "Learner fits", ["group"], registry=r)
        self.fit_errors = Counter(
            "specctl_daemon_fit_errors", "Learner fits that failed", ["group"], registry=r
        )
        self.pushes = Counter(
            "specctl_daemon_pushes", "Pushes by outcome", ["target", "outcome"], registry=r
        )
        self.rollbacks = Counter(
            "specctl_daemon_rollbacks", "Pushes rolled back", ["target"], registry=r
        )
        self.exploration_share = Gauge(
            "specctl_daemon_exploration_share",
            "Share of iterations the live table spends exploring",
            ["target"],
            registry=r,
        )
        self.predicted = Gauge(
            "specctl_daemon_predicted_tok_per_s",
            "Decode tok/s the learner predicts for the live table at the recent load",
            ["target"],
            registry=r,
        )
        self.measured = Gauge(
            "specctl_daemon_measured_tok_per_s",
            "Decode tok/s measured over the recent window",
            ["target"],
            registry=r,
        )
        self.policy_version = Gauge(
            "specctl_daemon_policy_version",
            "Version of the last pushed table",
            ["target"],
            registry=r,
        )
        self.target_up = Gauge(
            "specctl_daemon_target_up", "1 if the last scrape succeeded", ["target"], registry=r
        )

    def serve(self, host: str, port: int) -> int:
        """Serve /metrics on a daemon thread; returns the bound port."""
        server, _thread = start_http_server(port, addr=host, registry=self.registry)
        return int(server.server_address[1])

    def render(self) -> str:
        return generate_latest(self.registry).decode()
