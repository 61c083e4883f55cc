"""`specctl bench`: a concurrency sweep per forced depth, without restarting the server.

- `server_client`: the admin RPC (push / read back a table) and scrapes of one server.
- `metrics`: the contract's per-depth counters and SGLang's gauges from `/metrics` text.
- `prompts`: the prompts the load generator sends (a JSONL dataset or a synthetic default).
- `loadgen`: closed-loop streaming load on `/v1/completions`, one level of concurrency at a time.
- `sweep`: forces each depth, runs every level, restores the server's table whatever happens.
- `report`: crossovers, the recommended table, and the CSV / JSON / plot written to `--out`.
"""
