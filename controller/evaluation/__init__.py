"""The learner and the daemon run against the simulator, to measure how well they do.

- `synthetic`: counter samples straight from a profile's cost model (no scheduler).
- `sim_loop`: the learner in closed loop with the simulator engine, without the daemon.
- `evaluate`: the whole daemon against a simulated server, scored against the oracle and
  static policies (`specctl sim evaluate`).

It sits above both `models/` and `sims/`, which do not import each other.
"""
