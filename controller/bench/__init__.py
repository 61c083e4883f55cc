"""`specctl bench`: a concurrency sweep per forced depth, without restarting the server.

- `server_client`: the admin RPC (push / read back a table) and scrapes of one server.
- `metrics`: the contract's per-depth counters and SGLang's gauges from `/metrics` text.
- `prompts`: the prompts the load generator sends (JSONL, ShareGPT, or a synthetic default).
- `loadgen`: streaming load on `/v1/completions`, one level at a time (a fixed concurrency or
  Poisson / gamma arrivals at a rate), with a warm-up and every stream cut at the window's end.
- `latency`: TTFT / TPOT / ITL / end-to-end percentiles, goodput under a latency SLO.
- `sweep`: forces each depth, runs every level, drains the server between levels, restores the
  server's table whatever happens.
- `report`: crossovers, the recommended table (flagged levels left out, or a plain server that
  wins), and the CSV / JSON / plot written to `--out`.
"""
