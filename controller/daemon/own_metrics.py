"""The daemon's own /metrics (its own registry, so two daemons in one process do not clash).

Served on `metrics.host:metrics.port` (127.0.0.1:9465 by default). Times (`*_timestamp_seconds`)
are on the daemon's clock: Unix time on the wall clock, simulated seconds on a simulated one.
docs/operate.md lists what to watch; docs/operate/grafana-dashboard.json plots them.
"""

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
        self.push_reasons = Counter(
            "specctl_daemon_push_reasons",
            "Pushes sent, by why: takeover (the server ran SGLang's own choice), gain, "
            "evidence (probes the model needs), fewer_probes, cheaper_probes, rollback, "
            "frozen, handback (at exit)",
            ["target", "reason"],
            registry=r,
        )
        self.rollbacks = Counter(
            "specctl_daemon_rollbacks", "Pushes rolled back", ["target"], registry=r
        )
        self.exploration_share = Gauge(
            "specctl_daemon_exploration_share",
            "Share of decode iterations the last proposed table would spend probing, over the "
            "recent load (expected; specctl_daemon_probe_share is the measured one)",
            ["target"],
            registry=r,
        )
        self.probe_share = Gauge(
            "specctl_daemon_probe_share",
            "Share of the server's decode iterations that probed another depth, over the last "
            "scrape interval (measured from the plugin's counters)",
            ["target"],
            registry=r,
        )
        self.live_version = Gauge(
            "specctl_daemon_live_table_version",
            "Version of the table the server reports in /server_info (0: SGLang's own choice)",
            ["target"],
            registry=r,
        )
        self.live_tiers = Gauge(
            "specctl_daemon_live_tiers",
            "Tiers of the table the server runs (0: SGLang's own choice, no specctl table)",
            ["target"],
            registry=r,
        )
        self.live_probe_tiers = Gauge(
            "specctl_daemon_live_probe_tiers",
            "Tiers of the live table that probe other depths (0: the server does not explore)",
            ["target"],
            registry=r,
        )
        self.kept_found_table = Gauge(
            "specctl_daemon_kept_found_table",
            "1 while the server runs a table the daemon did not push (found at start-up, set "
            "by hand or from a policy file), kept until the model predicts push_min_gain over it",
            ["target"],
            registry=r,
        )
        self.store_samples = Gauge(
            "specctl_daemon_store_samples",
            "Samples of this target in the store (those from earlier runs included)",
            ["target"],
            registry=r,
        )
        self.last_fit = Gauge(
            "specctl_daemon_last_fit_timestamp_seconds",
            "When the group's learner was last fitted (model age: time() minus this)",
            ["group"],
            registry=r,
        )
        self.handback = Gauge(
            "specctl_daemon_handback_timestamp_seconds",
            "When the daemon last handed a target back at exit, by what it left: release "
            "(SGLang's own choice) or table (a table without probes); read back from the store "
            "at start-up, so it shows the previous run's exit",
            ["target", "left"],
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
