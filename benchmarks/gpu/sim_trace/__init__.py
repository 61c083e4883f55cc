"""The GPU harness's closed-loop trace, replayed in the simulator, and the two side by side.

    python -m benchmarks.gpu.sim_trace RUN_DIR [--seeds 0,1,2] [--profile FILE] [--accept ...]

After a GPU run with the `bench`, `acceptance` and `trace` steps, on any machine:

1. a simulator profile of the run's server, fitted to its bench (RUN/bench/bench.json) by
   `specctl sim fit`'s code (sims/fit), with one acceptance phase per dataset of the trace
   (a, b) whose accept lengths are the ones the acceptance step measured for that prompt
   family on the server (RUN/acceptance/acceptance.json), or `--accept NAME=D:L,...`;
2. the trace's phases as a scenario: the same seconds and streams, each phase's requests
   drawing that dataset's acceptance, the clients cut at each phase's end as the trace's
   load generator cuts its streams, the request lengths the trace sent (the bench's where its
   files do not record them), and the daemon's intervals and guardrails from
   `benchmarks.gpu.daemon_run.daemon_config`, which the GPU trace's daemon ran with;
3. every policy of RUN/trace/closed_loop.json run through that scenario on the same request
   stream per seed, as `specctl sim evaluate` runs its policies (the real daemon on the
   simulated clock, from an empty store or from the bench; the statics; the bench's table;
   SGLang's adaptive steps; a server without speculation);
4. RUN/trace/sim_closed_loop.json (closed_loop.json's shape, "source": "simulator") and
   RUN/trace/sim_compare.md, printed: per policy real and simulated tok/s, their ratio and
   both ranks, and whether the simulated trace ranks the policies as the real one does and
   is within 5% of it per policy; then each phase's real and simulated tok/s per policy
   (`phase_tok_per_s` in the JSON), from each real run's RUN/trace/LABEL.json. The profile
   and scenario are kept beside them
   (sim_profile.yaml, sim_scenario.yaml; `specctl sim evaluate --profile ... --scenario ...`
   reruns the daemon's part).
"""
