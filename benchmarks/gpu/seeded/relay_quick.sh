#!/usr/bin/env bash
# The depth-0 relay trims (sglang_hooks/lean_relay.py) on a speculative server alone, for a
# machine with little device time left: dummy 8B-shaped weights (no build), depths 0 and 3 only,
# decode CUDA graphs up to 16 requests (a short start). Then:
#   1. depth 0 with the trims off then on, ROUNDS times, at 1 and 4 streams (short levels,
#      short outputs; each bench cut at BENCH_TIMEOUT s, so a hang costs one bench);
#   2. greedy outputs at depth 0 with the trims off and on (the same prompts, compared).
# Every result lands in OUT as soon as it exists. The full check (1,000 switches, greedy against
# a plain server, the A/B against the plain server) is `h200_session.sh relay`.
#   source .gpu/stage.sh .gpu env >/dev/null; bash benchmarks/gpu/seeded/relay_quick.sh $OUT
# SERVER="..." replaces the server's command (a CPU dry run: `specctl sim serve --port 30000
# --admin-key relayquick`; the simulator accepts the trims' key and changes nothing).
set -uo pipefail
OUT=${1:?usage: relay_quick.sh OUT}
R=${R:-/tmp/relay-quick}
PY=${PY:-python3}
KEY=relayquick
URL=http://127.0.0.1:30000
mkdir -p "$OUT" "$R"
stamp() { echo "== $(date +%H:%M:%S) $*" | tee -a "$OUT/steps.txt"; }

if [ -z "${SERVER:-}" ]; then
    "$PY" -m benchmarks.gpu.harness models --run-dir "$R" >"$OUT/models.txt" 2>&1
    folder() { "$PY" -c "import json,sys; print(json.load(open(sys.argv[1]))['models'][sys.argv[2]])" \
        "$R/state.json" "$1"; }
    SERVER="$PY -m controller.cli serve --depths 0,3 -- --model-path $(folder target) \
        --load-format dummy --host 127.0.0.1 --port 30000 --sampling-backend pytorch \
        --context-length 4096 --max-running-requests 16 --cuda-graph-max-bs-decode 16 \
        --enable-metrics --admin-api-key $KEY --mem-fraction-static 0.7 \
        --speculative-algorithm EAGLE3 --speculative-eagle-topk 1 --speculative-num-steps 3 \
        --speculative-num-draft-tokens 4 --speculative-draft-model-path $(folder draft)"
fi
stamp "server: $SERVER"
setsid $SERVER >"$OUT/server.log" 2>&1 &
SERVER_PID=$!
for _ in $(seq "${START_S:-300}"); do
    curl -sf "$URL/health" >/dev/null 2>&1 && break
    kill -0 "$SERVER_PID" 2>/dev/null || break  # it exited: no point waiting
    sleep 1
done
curl -sf "$URL/health" >/dev/null || { stamp "server not up"; tail -30 "$OUT/server.log"; exit 1; }
stamp "server up"

relay() {
    curl -sS -X POST "$URL/set_internal_state" -H "Authorization: Bearer $KEY" \
        -H 'Content-Type: application/json' -d "{\"server_args\": {\"specctl_lean_relay\": $1}}"
    echo
}
for i in $(seq "${ROUNDS:-2}"); do
    for v in 0 1; do
        relay "$v" >/dev/null
        stamp "round $i, relay trims $v"
        timeout "${BENCH_TIMEOUT:-45}" "$PY" -m controller.cli bench --url "$URL" --admin-key "$KEY" \
            --depths 0 --concurrency 1,4 --duration-per-level "${LEVEL_S:-6}" \
            --warmup-per-level 1 --prompt-tokens 128 --output-tokens 64 \
            --out "$OUT/relay${v}_$i" >"$OUT/relay${v}_$i.txt" 2>&1
        echo "   rc=$? $(grep -E '^d0 ' "$OUT/relay${v}_$i.txt" | tr -s ' ' | tr '\n' ';')" \
            | tee -a "$OUT/steps.txt"
    done
done
curl -sS "$URL/server_info" >"$OUT/server_info.json"

stamp "greedy at depth 0, relay trims off and on"
timeout 60 "$PY" - "$URL" "$KEY" "$OUT/greedy.json" <<'PYCODE' 2>&1 | tee -a "$OUT/steps.txt"
import json, sys
import httpx
from controller.bench.server_client import ServerClient
from sglang_hooks.contract import single_depth_table

url, key, out = sys.argv[1:4]
body = {"sampling_params": {"temperature": 0, "max_new_tokens": 48, "ignore_eos": True}}
prompts = [[100 + 7 * i + j for j in range(24)] for i in range(4)]
outputs = {}
with ServerClient(url, key) as server, httpx.Client(base_url=url, timeout=60) as http:
    before = server.state()
    server.push(single_depth_table(0, version=before.version + 1))
    try:
        for relay in (0, 1, 0):
            http.post("/set_internal_state", headers={"Authorization": f"Bearer {key}"},
                      json={"server_args": {"specctl_lean_relay": relay}}).raise_for_status()
            got = [http.post("/generate", json={**body, "input_ids": p}).json().get("output_ids")
                   for p in prompts]
            outputs.setdefault(str(relay), []).append(got)
    finally:
        server.push(before.table)
same = outputs["1"][0] == outputs["0"][0] == outputs["0"][1]
json.dump({"identical": same, "outputs": outputs}, open(out, "w"))
print(f"greedy outputs at depth 0 identical with the relay trims off, on, off: {same}")
PYCODE
curl -sS "$URL/server_info" >"$OUT/server_info_end.json"
grep -iE 'specctl|error|traceback' "$OUT/server.log" | tail -40 >"$OUT/server_log_specctl.txt"
stamp "done"
