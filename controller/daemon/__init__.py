"""The daemon's data path, one module per stage, in the order data flows through them.

- `transport`: how the daemon reaches a server (loopback/remote HTTP, or an in-process simulator).
- `config`: `controller.yaml`, validated; `default.yaml` is the embedded default.
- `own_metrics`: the daemon's own `/metrics`.
- `policy_file`, `frozen`: the frozen policy file (format, and frozen mode's input).
- `scrape`, `sources`: `/metrics` text (or Prometheus) to counter deltas to `Sample`s.
- `store`: SQLite: samples, counter snapshots, pushes, rollbacks, learner snapshots.
- `model`: one learner per group of targets.
- `takeover`: the server's own measured choice, which the first table keeps unless beaten.
- `reaction`: whether a scrape shows load or acceptance moving (re-decide at once).
- `guardrails`: the proposed table restricted and bounded; after-push check and rollback.
- `push_gate`: whether a proposal is worth pushing (a stated gain, or evidence it would add).
- `push`: the table sent with `/set_internal_state` and read back.
- `handback`: what the daemon leaves on a server when it stops (`on_exit`), never with probes.
- `loop`: `Controller`, which ties the stages together per target (clock-free).
- `runner`: the drivers of the loop, on real time or a simulated clock.

Each stage imports only stages listed before it, so each can be tested alone.
"""
