#!/usr/bin/env bash
# The daemon on the simulated shape server, from an empty store, over the closed loop
# 1-4-16-64-128-256-128-64-16-4-1 streams of family b, against each static shape and the
# bench's table on the same trace. Run from the repository root; writes beside this script.
set -euo pipefail
here=benchmarks/results/shape_daemon_sim
common=(--profile benchmarks/results/shape_sim_run30.yaml --shapes 3x4x16,3x1x4,plain
        --phase b --output-tokens 128:384 --duration 60 --warmup 10 --daemon --json)
for seed in 0 1 2; do
  specctl sim shapes "${common[@]}" --closed-loop 60 --seed "$seed" > "$here/step60_seed$seed.json"
done
specctl sim shapes "${common[@]}" --closed-loop 300 --seed 0 > "$here/step300_seed0.json"
