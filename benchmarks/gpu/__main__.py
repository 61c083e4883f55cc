"""The GPU harness: a speculative and a plain SGLang server on one GPU, checked and measured.

    python -m benchmarks.gpu STEP [STEP...] --run-dir DIR [--options]

Steps run in this order, whatever order a command gives them (`all`: every one):

  setup       The machine's facts (each GPU's name, memory and driver from nvidia-smi; the CPU
              model and which CPUs share a core, in DIR/cpu_topology.txt), the model folders
              (--models dummy: configs for random weights; --models seeded: the seeded pair
              built by benchmarks/gpu/seeded/build.py, with its prompt families a and b; or
              --target/--draft), and both servers up: the speculative one through `specctl
              serve` with the plugin, the plain one stock SGLang. A server already up with the
              same launch is kept; one whose launch changed is restarted.
  acceptance  The head's accept length per prompt family and depth (--acceptance-depths),
              and what a request accepts once drafting resumes after its first
              --acceptance-off-spell tokens at depth 0.
  check       The plugin's smoke test; the greedy lossless check (the speculative server's
              greedy tokens against the plain server's, with depth switches mid-request); then
              --switches depth on/off pushes under load, with the greedy check after.
  bench       `specctl bench` over the bench depths, the plain server beside.
  parity      Depth 0 against the plain server. Once per start of the servers, a warm pass
              and both servers' garbage collectors frozen; then --parity-series paired series
              (depth 0 and the plain server back to back at each load, the order alternating
              by series, prompts drawn afresh each series, output lengths spread over
              --output-spread, --client-processes load processes), numbered on across
              commands; then the verdict over every series of the run, DIR/parity/parity.txt:
              depth 0's tok/s over the plain server's per level, pooled, with its 90% interval.
  compare     `specctl bench` beside SGLang's own client (`sglang.bench_serving`) on the
              speculative server: the same prompts (exactly --compare-input-tokens tokens in
              the target's tokenizer), concurrency, request count and depth at each level of
              --compare-concurrency (benchmarks/gpu/compare_clients.py); DIR/compare/.
  shapes      SGLang's own static draft shapes (--shapes: chains and trees, STEPSxTOPKxDRAFT,
              and plain), each on a stock SGLang server started alone on the GPU (the run's
              servers stopped first), benched at every load of --shape-streams on every
              prompt family; DIR/shapes/shapes.txt says whether a tree beats the best chain
              (benchmarks/gpu/steps/shapes.py). `setup --no-setup-servers` for shapes alone.
  treeswitch  Draft shapes switched inside one server (--switch-shapes: the dominating one
              started, the plugin capturing the others, plain beside a tree as off),
              against a plain and stock servers, each alone: capture cost, greedy outputs
              held and switching, held benches and their best shape per load as a policy
              file, switches under load
              (benchmarks/gpu/steps/treeswitch.py).
  trace       A closed-loop load trace (--trace-phases) under each policy of
              --trace-policies (static:D; static:3x4x16 on a server of --spec-shapes,
              static:0 off there with plain listed;
              bench-table and daemon-from-bench start from --trace-bench, or the run's
              bench), --trace-repeats times, then every run side by side:
              DIR/trace/compare.md, and each policy's tok/s per repeat in closed_loop.json
              (`python -m benchmarks.gpu.sim_trace DIR` replays it in the simulator).
  daemon      `specctl daemon` against the speculative server under a stepped load.
  summary     DIR/summary.md and summary.json (also rewritten at the end of every command).
  stop        Both servers stopped.

A run lives in DIR/state.json: options given once stay for the run's later commands (only
--run-dir must be repeated; give an option again to change it), and the servers stay up
between commands. A failing step records its error and the next step still runs. Exit
status: 0 when every step passed, 1 when one failed or was skipped, 2 for a bad option or
step name (one line naming it). --budget SECONDS fits a command into a time limit (steps cut
short keep what they measured); --out-tar FILE packs the run folder into one archive
(weights and prompt sets left out) at the end of the command, and after each parity series
and trace policy, so a command cut off still brings its results back.

A session with the seeded 8B pair on a machine where one command may run at most ten
minutes (the runs' times: setup 5-6.5 minutes; a warm pass with four series of 1-128
streams at 8 s levels 8 minutes):

    A="--run-dir /tmp/run --out-tar $OUT/run.tar.gz --budget 570"
    python -m benchmarks.gpu setup $A --models seeded --spec-cpus 0-5 --plain-cpus 6-11 \\
        --bench-cpus 12-15 --server-args "--sleep-on-idle --max-total-tokens 65536"
    python -m benchmarks.gpu acceptance check $A
    python -m benchmarks.gpu bench $A
    python -m benchmarks.gpu parity $A                # the warm pass and three series
    python -m benchmarks.gpu parity $A                # three more, judged with the first
    python -m benchmarks.gpu trace $A
    python -m benchmarks.gpu daemon summary stop $A

On a CPU, every step against `specctl sim serve` stand-ins, for trying the harness itself:

    python -m benchmarks.gpu all --tiny --backend sim --sim-speedup 20 --run-dir /tmp/sim

(add --models seeded for the tiny seeded pair and its prompt families, where torch is
installed).
`python -m benchmarks.gpu --help` lists every option with its default.
"""

from __future__ import annotations

import sys

from benchmarks.gpu.harness import main

if __name__ == "__main__":
    sys.exit(main())
