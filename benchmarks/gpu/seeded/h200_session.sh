#!/usr/bin/env bash
# One measurement session of the seeded model pair on one GPU, in steps that each fit one
# command of at most ten minutes, run back to back while the machine (and its servers) stay up:
#
#   bash benchmarks/gpu/seeded/h200_session.sh setup OUT     # build, both servers, acceptance
#   DEVICE_TIMER=1 bash benchmarks/gpu/seeded/h200_session.sh restart OUT  # servers only, timed
#   bash benchmarks/gpu/seeded/h200_session.sh measure OUT   # bench, off modes, 1,000 switches
#   bash benchmarks/gpu/seeded/h200_session.sh traces OUT "static:3 static:1 sglang daemon"
#   bash benchmarks/gpu/seeded/h200_session.sh traces OUT "daemon-warm plain static:0" final
#   bash benchmarks/gpu/seeded/h200_session.sh parity OUT    # bench with 4 client processes, repeats
#   bash benchmarks/gpu/seeded/h200_session.sh profile OUT   # GPU kernels per iteration: d0 vs plain
#   bash benchmarks/gpu/seeded/h200_session.sh long OUT      # 64 and 128 streams, long levels
#   SPECCTL_VERIFY_SCHEDULE=1 ACCEPTANCE=0 bash benchmarks/gpu/seeded/h200_session.sh setup OUT
#   bash benchmarks/gpu/seeded/h200_session.sh verify OUT    # that server: greedy, d0 vs plain
#   bash benchmarks/gpu/seeded/h200_session.sh series OUT    # d0 vs plain, SERIES series, pooled
#   bash benchmarks/gpu/seeded/h200_session.sh context OUT   # benches at two prompt lengths
#   bash benchmarks/gpu/seeded/h200_session.sh lean OUT      # d0 with/without host trims vs plain
#   bash benchmarks/gpu/seeded/h200_session.sh trims OUT     # trims on, 1,000 switches, greedy
#   bash benchmarks/gpu/seeded/h200_session.sh hostd1 OUT    # depth 1 vs 3: bench, host profile
#   PYSPY=path bash benchmarks/gpu/seeded/h200_session.sh hostwatch OUT  # host CPU, d0 vs plain
#   bash benchmarks/gpu/seeded/h200_session.sh relay OUT     # relay trims off/on; RELAY_PART=check
#   bash benchmarks/gpu/seeded/h200_session.sh offspell OUT  # acceptance after off, prefill skip on/off
#   SPECCTL_PLAIN_DECODE=1 ACCEPTANCE=0 bash benchmarks/gpu/seeded/h200_session.sh setup OUT
#   TAG=after bash benchmarks/gpu/seeded/h200_session.sh plainstate OUT  # what depth 0's plain
#                                  # decode path did (sglang_hooks/plain_decode.py)
#   bash benchmarks/gpu/seeded/h200_session.sh plainab OUT   # that path on and off, one start
#   bash benchmarks/gpu/seeded/h200_session.sh h2dprobe OUT  # does a pageable copy wait for its
#                                  # stream (benchmarks/gpu/h2d_probe.py; no server needed)
#
# Measured on the H200: setup with ACCEPTANCE=0 330-370 s; series with SERIES=3 LEVEL_S=8
# 358 s; parity 319 s; verify 225 s; profile about 100 s. context: two benches of 20 levels,
# about 150 s each at LEVEL_S=5 on the family's own prompts (run 3's parity: 40 such levels
# and a warm pass in 319 s); its 512-word bench once ran past 470 s, hence BENCH_TIMEOUT
# (run 6, spread outputs: 296 s for both benches); HOST=1 profile plus SERIES=2 LEVEL_S=8
# series 359 s; SERIES=2 LEVEL_S=10 series 299 s; run 7: setup 364 s, BENCHES=family LEVEL_S=12
# context 288 s, SERIES=2 LEVEL_S=8 lean 483 s; run 8: setup 337 s plus trims 45 s, SPREAD=64:192
# BENCHES=family LEVEL_S=12 context 285 s, LONG_DEPTHS= REPS=2 long 160 s, LEVEL_S=10 hostd1
# about 150 s; run 9: setup 387 s, HOST_STREAMS=1,4,128 WATCH_S=8 hostwatch with py-spy 81 s, and
# one relay A/B bench (d0 and plain at 1,4,16, LEVEL_S=8) 65 s; run 10: setup 399 s plus
# RELAY_PART=check relay 60 s, SPREAD=64:192 LEVEL_S=8 RELAY_ROUNDS=2 RELAY_STREAMS=1,4,16,64,128
# relay 459 s, SPREAD=64:192 BENCHES=family LEVEL_S=12 context 288 s; run 11: setup 370 s,
# SPREAD=64:192 BENCHES="family family" LEVEL_S=11 context 531 s, SERIES=2 LEVEL_S=8 series
# with its warm pass past 250 s; run 12: setup 358 s then BENCHES=warm LEVEL_S=5 context 148 s
# in one call, BENCHES="family family" LEVEL_S=11 context 538 s, one family bench 270 s; run 13:
# setup 366 s then SERIES=1 LEVEL_S=10 series (warm pass and one paired series) 174 s in one
# call, WARM=0 SERIES=4 LEVEL_S=10 series 531 s; run 14: setup 365-395 s, the warm pass 34-36 s,
# a paired series of 1-128 streams at LEVEL_S=10 about 125 s, one of STREAMS=64,128 at
# LEVEL_S=30 137-146 s; run 17: setup 387 s (282 s on a second machine), the warm pass and one
# SERIES=1 LEVEL_S=10 series 190 s, one series without the warm pass about 150 s, offspell
# (before its slot scrub) 35 s, PROFILE_OUTPUT=1 PROFILE_STEPS=60 profile at 1,4 streams and a
# PROFILE_STEPS=600 one at 4,16 streams about 150 s together; run 18: setup 361-385 s,
# offspell with the scrub (one round) 24 s, hostwatch at 4,16 streams 50 s, relay with
# RELAY_ROUNDS=2 at 4,16 streams 250 s; run 19: setup 296-310 s, OFFSPELL_ROUNDS=3 offspell about
# 70 s, hostwatch at 4,128 streams (no warm pass then) about 55 s, the warm pass and three
# SERIES=3 LEVEL_S=10 series 450 s, the warm pass and one SWAP_CORES=1 series 175 s; run 24:
# the 16 MiB parts about 3 s a call, setup 373 s, RELAY_PART=check relay 109 s, plainab with
# its warm pass and AB_ROUNDS=2 at STREAMS=64,128 about 265 s, hostwatch at one load 28 s.
# Issue each call as soon as the last returns: the machine is released after 30 s idle, and
# starting again costs staging and setup. Every call after staging carries
# .gpu/stage.sh (carry: [".gpu/stage.sh"]) and starts with `source .gpu/stage.sh .gpu env`.
#
# ACCEPTANCE=0 leaves the acceptance measurements out of `setup` (servers only); SERVER_ARGS
# adds SGLang arguments to both servers (one string, e.g. "--gc-warning-threshold-secs 0.05").
# Since run 24 the runs give both servers --sleep-on-idle: in a paired bench one server idles
# while the other is measured, and an idle SGLang scheduler otherwise polls at 100% of a CPU.
# DEVICE_TIMER=1 starts both servers with SGLANG_ENABLE_METRICS_DEVICE_TIMER=1: SGLang then
# times every forward with CUDA events and exports the GPU seconds per forward kind, which
# `specctl bench` splits into prefill and decode per level (GPU prefill/decode column). Off by
# default: in the one run with it (run 6) depths 1 and 3 ran 20-30% slower at one stream than
# in the runs without it, on the host side (cause not isolated). Run `profile` last: after a
# HOST=1 profile both servers of run 6 were 27-32% slower on the same workload.
# SGLANG_FORCE_COARSE_WAR_BARRIER=1 in the environment of `setup` or `restart` reaches both
# servers' launches (benchmarks/gpu/servers.py): the plain server's scheduler then waits for
# its whole last forward before preparing the next batch, as the EAGLE server does at depth 0.
# The plugin's start-up switches (SPECCTL_PLAIN_DECODE, SPECCTL_VERIFY_SCHEDULE, ...) reach the
# speculative server's launch the same way: `restart` after changing one restarts that server.
# One left unset is `specctl serve`'s to set (all seven on SGLang 0.5.17): set it to 0 to run
# without it.
# Every step leaves its files under $R (default /tmp/gpu-run) and packs the whole folder into
# OUT/run.tar.gz (weights left out), so each step's results come back even if a later one fails.
# SGLang must be importable: docs/sglang.md "Getting SGLang onto a machine without network"
# (`source .gpu/stage.sh .gpu env`, after benchmarks/gpu/staging/pack.sh).
set -uo pipefail
# A step goes on past a command that fails inside it, so that what the rest measures still comes
# back, but it exits 1 at the end (after packing), naming each failure on stderr as it happens:
# a caller's `&&` or exit status then tells a step that lost part of its work from a clean one.
failed=0
set -E
trap 'rc=$?; failed=1; echo "h200_session.sh: failed (exit $rc) at line $LINENO: $BASH_COMMAND" >&2' ERR

STEP=${1:?usage: h200_session.sh setup|restart|measure|traces|parity|profile|long|verify|series|lean|context|trims|hostd1|hostwatch|relay|offspell|plainstate|plainab|h2dprobe OUT [POLICIES] [final]}
OUT=${2:?give the folder to pack the results into}
R=${R:-/tmp/gpu-run}
PY=${PY:-python3}
# The trace: low load, a ramp into saturation on the easy family, then the hard family at low
# load and at saturation (where the best depth changes), then low load again.
PHASES=${PHASES:-10:2:a,12:16:a,15:128:a,15:4:b,20:128:b,10:4:b}
LEVEL_S=${LEVEL_S:-5}  # seconds per bench level, after a 1.5 s warm-up
# HARNESS_EXTRA: more harness options. A dry run of every step on a CPU, against
# `specctl sim serve` stand-ins and the tiny seeded pair (about 8 minutes; python with torch):
#   R=/tmp/dry PY=.venv-sglang/bin/python LEVEL_S=0.5 PHASES=2:2:a,2:16:a,2:4:b \
#   HARNESS_EXTRA="--backend sim --tiny --seeded-args=--tiny --sim-speedup 20" \
#   bash benchmarks/gpu/seeded/h200_session.sh setup|measure|traces ...
[ "${DEVICE_TIMER:-0}" = 1 ] && export SGLANG_ENABLE_METRICS_DEVICE_TIMER=1
read -r -a EXTRA <<<"${HARNESS_EXTRA:-}"
HARNESS_OPTS=(--run-dir "$R" --models seeded --depths 0,1,3 --bench-duration "$LEVEL_S"
              --smoke-seconds 4 --greedy-prompts 4 --greedy-tokens 128 --switches 1000
              --switch-interval 0.02 "${EXTRA[@]}")
[ -n "${SERVER_ARGS:-}" ] && HARNESS_OPTS+=(--server-args "$SERVER_ARGS")
# SPEC_CPUS=0-5 PLAIN_CPUS=6-11 BENCH_CPUS=12-15: each server (every process it starts) and the
# bench client on their own cores (benchmarks/gpu/cpus.py); a server started with other cores
# is restarted, not reused. Unset: no pinning.
[ -n "${SPEC_CPUS+x}" ] && HARNESS_OPTS+=(--spec-cpus "$SPEC_CPUS")
[ -n "${PLAIN_CPUS+x}" ] && HARNESS_OPTS+=(--plain-cpus "$PLAIN_CPUS")

key() { "$PY" -c "import json,sys; print(json.load(open(sys.argv[1]))['admin_key'])" "$R/state.json"; }
server_field() {  # server_field spec|plain FIELD: from the harness's state
    "$PY" -c "import json,sys; print(json.load(open(sys.argv[1]))['servers'][sys.argv[2]][sys.argv[3]])" \
        "$R/state.json" "$1" "$2"
}
url_of() { server_field "$1" url; }
pid_of() { server_field "$1" pid; }  # the server's session leader
# The cores each server runs on now (SWAP_CORES trades them for a series step).
SPEC_CORES=${SPEC_CPUS:-0-5}; PLAIN_CORES=${PLAIN_CPUS:-6-11}
swap_cores() {  # swap_cores SPEC PLAIN: move the running servers (no restart) to those cores
    "$PY" -m benchmarks.gpu.cpus repin "$(pid_of spec)" "$1" \
        && "$PY" -m benchmarks.gpu.cpus repin "$(pid_of plain)" "$2" \
        && SPEC_CORES=$1 PLAIN_CORES=$2
}
spec_url() { url_of spec; }
plain_url() { url_of plain; }
side_logs() {  # side_logs PREFIX: the GPU's clocks (250 ms) and the CPUs (1 s) until side_logs_end
    SIDE_PIDS=()
    "$PY" -m benchmarks.gpu.cpu_log record --out "$1cpus.jsonl" --interval 1 &
    SIDE_PIDS+=($!)
    command -v nvidia-smi >/dev/null || return 0
    local fields=timestamp,clocks.sm,power.draw,temperature.gpu,utilization.gpu
    # Why a clock is held down, where this driver names it (older ones call it throttle).
    nvidia-smi --query-gpu=clocks_event_reasons.active --format=csv,noheader >/dev/null 2>&1 \
        && fields="$fields,clocks_event_reasons.active"
    nvidia-smi --query-gpu="$fields" --format=csv,noheader,nounits -lms 250 >>"$1clocks.csv" \
        2>/dev/null &
    SIDE_PIDS+=($!)
}
side_logs_end() {  # then cut both by the levels of the benches named
    local prefix=$1; shift
    [ "${#SIDE_PIDS[@]}" -gt 0 ] && { kill "${SIDE_PIDS[@]}" 2>/dev/null || true; }; SIDE_PIDS=()
    [ $# -gt 0 ] || return 0
    [ -s "${prefix}clocks.csv" ] && "$PY" -m benchmarks.gpu.gpu_clocks "${prefix}clocks.csv" \
        "$@" --json "${prefix}clocks.json" >"${prefix}clocks.txt" 2>&1
    [ -s "${prefix}cpus.jsonl" ] && "$PY" -m benchmarks.gpu.cpu_log levels "${prefix}cpus.jsonl" \
        "$@" --cores "spec=$SPEC_CORES" --cores "plain=$PLAIN_CORES" \
        --cores "bench=${BENCH_CPUS:-12-15}" --json "${prefix}cpus.json" >"${prefix}cpus.txt" 2>&1
    return 0
}

stamp() { echo "== $(date +%H:%M:%S) $*"; }
cores_back() {  # after SWAP_CORES: each server back on the cores it started on
    [ "$SPEC_CORES" = "${SPEC_CPUS:-0-5}" ] && return 0
    swap_cores "$SPEC_CPUS" "$PLAIN_CPUS"
}

plugin_setting() {  # plugin_setting KEY VALUE: one plugin setting pushed to the spec server
    # A refusal (the server's 400 names the key and why) fails the call, so the step reports
    # it at the end instead of going on green with the setting unchanged.
    local answer code
    answer=$(curl -sS -X POST "$(spec_url)/set_internal_state" -H "Authorization: Bearer $(key)" \
        -H 'Content-Type: application/json' -d "{\"server_args\": {\"$1\": $2}}" \
        -w '\n%{http_code}') || return 1
    code=${answer##*$'\n'}
    echo "${answer%$'\n'*}"
    [ "$code" = 200 ] || { echo "plugin_setting: $1=$2 answered $code" >&2; return 1; }
}
off_mode() { plugin_setting specctl_off_mode "$1"; }  # 0 = sglang, 1 = skip-extend (default)
lean_host() { plugin_setting specctl_lean_host "$1"; }  # 0|1: host-work trims (lean_host.py)

# every request's length, unless a step spreads them. OUTPUT_LEN=N sets it: with N beyond what a
# level's window decodes (2048 at LEVEL_S=6: under 1,000 tokens a stream at 128 streams), no
# request ends and none is admitted inside the window, so a level times decode iterations alone
OUTPUT_TOKENS=(--output-tokens "${OUTPUT_LEN:-128}")
bench() {  # bench OUTDIR EXTRA...: the harness bench's workload (family a, 128-token outputs)
    # BENCH_TIMEOUT=S: SIGTERM after S seconds (the bench then restores the table and writes
    # the levels it finished, marked interrupted).
    # FLUSH=1: both servers' prefix caches emptied before each level (--flush-cache), so no
    # level pays for evicting what earlier ones cached (each bench records its evictions).
    local dir=$1; shift
    local cut=() flush=()
    [ -n "${BENCH_TIMEOUT:-}" ] && cut=(timeout "$BENCH_TIMEOUT")
    [ "${FLUSH:-0}" = 1 ] && flush=(--flush-cache)
    if [ -n "${BENCH_CPUS:-}" ]; then
        cut+=("$PY" -m benchmarks.gpu.cpus "$BENCH_CPUS" --)
        echo "bench client on cores $BENCH_CPUS"
    fi
    "${cut[@]}" "$PY" -m controller.cli bench --url "$(spec_url)" --admin-key "$(key)" \
        --dataset "${DATASET:-$R/models/seeded/family_a.jsonl}" "${OUTPUT_TOKENS[@]}" \
        --concurrency 1,4,16,64,128 --duration-per-level "$LEVEL_S" --warmup-per-level 1.5 \
        --out "$dir" "${flush[@]}" "$@"
}

spread_outputs() {  # with SPREAD=LOW:HIGH, the benches' dataset gets output lengths over that range
    # and FRESH (20000) prompts freshly drawn from the family's words, so that no prompt comes
    # round again while a server's prefix cache holds it: a whole-prompt hit leaves a one-token
    # prefill, which the plain server ran without its prefill CUDA graph and the EAGLE server
    # never had (runs 10-14: their logs, docs/sglang.md). FRESH=0: the family's 512 prompts, as
    # runs up to the fourteenth had them. `spread_outputs SEED`: another draw, for a bench that
    # follows another on the same servers (every bench sends its prompts from the first on, so
    # the same draw would repeat the last bench's: run 15's warm pass left 90 whole hits).
    [ -n "${SPREAD:-}" ] || return 0
    local seed=${1:-0}
    DATASET="$R/models/seeded/family_a_spread${1:+_$1}.jsonl"; OUTPUT_TOKENS=()
    "$PY" -m benchmarks.gpu.seeded.datasets "$R/models/seeded/family_a.jsonl" "$DATASET" \
        --output-tokens "$SPREAD" --seed "$seed" $(fresh_args)
}

fresh_seed() {  # fresh_seed BASE: the first seed from BASE on that no dataset of this run used,
    # so that a later call's benches (WARM=0, another SERIES_TAG) never replay an earlier draw
    # on servers whose prefix caches may still hold it (run 16's tagged series drew seeds 1-2
    # again: with the off spell and the profiles, 26 more one-token prefills on the plain server)
    local seed=$1
    while [ -e "$R/models/seeded/family_a_spread_$seed.jsonl" ]; do seed=$((seed + 1)); done
    echo "$seed"
}

fresh_args() {  # the datasets option for FRESH fresh prompts (none with FRESH=0)
    [ "${FRESH:-20000}" = 0 ] || echo --fresh "${FRESH:-20000}"
}

warm_d0_plain() {  # warm_d0_plain DIR: an unreported pass of d0 and plain at every level, so
    # Triton compiles the large batch shapes outside the measured windows (run 9: 5% of one
    # 128-stream window); its output goes to DIR.txt
    stamp "warm pass (not reported): d0 and plain at every level"
    bench "$1" --depths 0 --no-spec-url "$(plain_url)" --duration-per-level 2 \
        --warmup-per-level 0.5 --client-processes 4 >"$1.txt" 2>&1
}

warm_pass() {  # warm_pass DIR: warm_d0_plain on a fresh draw of prompts (seeds from 1000 on),
    # unless WARM=0 (a later call on servers already warm)
    [ "${WARM:-1}" = 1 ] || return 0
    spread_outputs "$(fresh_seed 1000)"; warm_d0_plain "$1"
}

fresh_dir() {  # fresh_dir PATH: PATH, or PATH_2, PATH_3... when a bench already wrote there
    local dir=$1 n=2
    while [ -e "$dir" ]; do dir="$1_$n"; n=$((n + 1)); done
    echo "$dir"
}

freeze_gc() {  # freeze_gc spec|plain: SGLang's /freeze_gc (scheduler, tokenizer, detokenizer)
    curl -sS -X POST "$(url_of "$1")/freeze_gc" -H "Authorization: Bearer $(key)" || true
    echo
}

pack() {
    "$PY" -m benchmarks.gpu.harness summary ${FINAL:+stop} --run-dir "$R" \
        --out-tar "$OUT/run.tar.gz" >"$R/pack_$STEP.txt" 2>&1 || tail -5 "$R/pack_$STEP.txt"
    ls -la "$OUT"
}

case "$STEP" in
h2dprobe)
    # Whether a small host-to-device copy from pageable memory blocks the host while its stream
    # waits for another, as spec-v2's decode preparation makes one behind the barrier on the last
    # forward (docs/h200-runs.md); the same from pinned memory beside it.
    # About ten seconds on the GPU; the servers may run or not.
    mkdir -p "$R"
    stamp "host-to-device copies, pageable and pinned, idle and behind a wait"
    "$PY" -m benchmarks.gpu.h2d_probe --wait-ms "${PROBE_WAIT_MS:-3}" --sizes "${PROBE_SIZES:-4,128}" \
        --json "$R/h2d_probe.json" | tee "$R/h2d_probe.txt"
    pack
    ;;
plainstate)
    # The spec server's /server_info (as server_info_spec_TAG.json) and, per scheduler, what
    # depth 0's plain decode path did: its runner's capture time and GPU memory, the depth-0
    # batches it ran and those that kept the verify; with SGLang's start-up time and memory.
    info="$R/server_info_spec_${TAG:-now}.json"
    curl -sS "$(spec_url)/server_info" -H "Authorization: Bearer $(key)" >"$info"
    "$PY" - "$info" <<'PY' | tee "$R/plain_decode_${TAG:-now}.txt"
import json, sys
info = json.load(open(sys.argv[1]))
for i, state in enumerate(info.get("internal_states") or []):
    print(f"scheduler {i}: plain_decode {json.dumps((state.get('specctl') or {}).get('plain_decode'))}")
    print(f"  startup_time {json.dumps(state.get('startup_time'))}")
    print(f"  memory_usage {json.dumps(state.get('memory_usage'))}")
PY
    pack
    ;;
plainab)
    # Depth 0 with its plain decode path on and off, each against the plain server, on one
    # start of the spec server (which needs SPECCTL_PLAIN_DECODE=1: the DECODE graphs are
    # captured at start-up; the admin key `specctl_plain_decode` switches the path between
    # benches). AB_ROUNDS rounds (default 3), each a paired bench with the path on and one
    # with it off, which goes first alternating between rounds (and within each pair, which
    # server goes first), after a warm pass and /freeze_gc on both servers; judged pooled per
    # arm (benchmarks/gpu/parity.py: parity_plain_on.txt, parity_plain_off.txt). STREAMS
    # (default 16,64,128), LEVEL_S and SPREAD as in `series`; each bench draws fresh prompts.
    # A later call (WARM=0) numbers its rounds on from the last in $R, and the verdict pools
    # them all, so rounds can spread over several calls. The path is left on.
    # AB_KEY=KEY: the arms switch another 0/1 admin key instead (specctl_lean_host, say; name
    # the rounds apart with AB_TAG); AB_ARMS=on: every round one bench, with the key on.
    ab_key=${AB_KEY:-specctl_plain_decode}
    ab_what="the plain decode path"; [ "$ab_key" = specctl_plain_decode ] || ab_what=$ab_key
    case ${AB_ARMS:-on,off} in
        on,off) ab_arms=(1 0) ;;
        on) ab_arms=(1) ;;
        *) echo "AB_ARMS: expected on,off or on, got $AB_ARMS" >&2; exit 2 ;;
    esac
    if [ "${SPECCTL_PLAIN_DECODE:-0}" != 1 ]; then
        echo "plainab: start the spec server with SPECCTL_PLAIN_DECODE=1" >&2; exit 2
    fi
    # AB_TAG=NAME keeps a set of rounds apart (plainab_NAME_on_1, ..., parity_plain_NAME_on.txt),
    # for rounds that must not pool with the rest (FLUSH=1 ones, say).
    ab=plainab${AB_TAG:+_$AB_TAG}
    warm_pass "$R/${ab}_warm"
    freeze_gc spec; freeze_gc plain
    first=1
    while [ -e "$R/${ab}_on_$first" ] || [ -e "$R/${ab}_off_$first" ]; do first=$((first + 1)); done
    # The GPU's clocks and the machine's CPUs beside every bench, as `series` logs them: the
    # servers drifted over the twenty-third run's benches, and these say whether the machine did.
    side_logs "$R/${ab}_"; trap 'side_logs_end "$R/${ab}_"' EXIT; trap 'exit 143' TERM
    # PYSPY=path: both schedulers' stacks every STACKS_EVERY seconds (default 120) through the
    # rounds, and each server's first against its last (benchmarks/gpu/stack_watch.py): which
    # host work grew while the servers slowed (the twenty-third run).
    if [ -n "${PYSPY:-}" ]; then
        "$PY" -m benchmarks.gpu.stack_watch record --run-dir "$R" --py-spy "$PYSPY" \
            --out "$R/${ab}_stacks" --every "${STACKS_EVERY:-120}" --seconds 6 &
        SIDE_PIDS+=($!)
    fi
    for i in $(seq "$first" $((first + ${AB_ROUNDS:-3} - 1))); do
        arms=("${ab_arms[@]}"); order_flag=()
        if [ $((i % 2)) = 0 ]; then
            order_flag=(--plain-first); [ ${#arms[@]} = 2 ] && arms=(0 1)
        fi
        for on in "${arms[@]}"; do
            arm=off; [ "$on" = 1 ] && arm=on
            stamp "round $i: depth 0 with $ab_what $arm, and the plain server"
            plugin_setting "$ab_key" "$on"
            spread_outputs "$(fresh_seed 3000)"
            bench "$R/${ab}_${arm}_$i" --depths 0 --no-spec-url "$(plain_url)" --paired \
                "${order_flag[@]}" --client-processes 4 --warmup-per-level 2 \
                --concurrency "${STREAMS:-16,64,128}" 2>&1 | tee "$R/${ab}_${arm}_$i.txt" \
                | tail -8
            pack
        done
    done
    side_logs_end "$R/${ab}_" "$R/${ab}"_o[nf]*_[0-9]*/
    if [ -n "${PYSPY:-}" ]; then
        sleep 1  # the recorder writes its index on SIGTERM
        "$PY" -m benchmarks.gpu.stack_watch compare "$R/${ab}_stacks" >"$R/${ab}_stacks.txt"
        head -40 "$R/${ab}_stacks.txt"
    fi
    "$PY" -m benchmarks.gpu.timeline "$R/${ab}"_o[nf]*_[0-9]*/ --json "$R/${ab}_timeline.json" \
        >"$R/${ab}_timeline.txt" && sed -n '/ms per pass over/,$p' "$R/${ab}_timeline.txt"
    plugin_setting "$ab_key" 1
    for arm in on off; do
        # with AB_ARMS=on, an off verdict only where earlier calls benched that arm
        [ "$arm" = off ] && [ ${#ab_arms[@]} = 1 ] \
            && ! compgen -G "$R/${ab}_off_[0-9]*/" >/dev/null && continue
        "$PY" -m benchmarks.gpu.parity "$R/${ab}_${arm}"_[0-9]*/ \
            --json "$R/parity_plain${AB_TAG:+_$AB_TAG}_$arm.json" \
            | tee "$R/parity_plain${AB_TAG:+_$AB_TAG}_$arm.txt"
    done
    pack
    ;;
setup)
    # Which CPUs share a physical core, and the machine's CPU model: an idle SGLang scheduler
    # spins one CPU at 100% unless started with --sleep-on-idle, and a spinning sibling slows
    # the core the other server's scheduler runs on.
    mkdir -p "$R"
    { lscpu 2>&1; echo; grep -H . /sys/devices/system/cpu/cpu*/topology/thread_siblings_list \
        2>&1; } >"$R/cpu_topology.txt"
    stamp "models and servers"
    "$PY" -m benchmarks.gpu.harness models start "${HARNESS_OPTS[@]}" --budget 430
    [ "${ACCEPTANCE:-1}" = 0 ] && { pack; exit "$failed"; }
    stamp "acceptance per family and depth, then the off spell in each off mode"
    A="$R/acceptance"; mkdir -p "$A"
    DS=(--dataset "$R/models/seeded/family_a.jsonl" --dataset "$R/models/seeded/family_b.jsonl")
    "$PY" -m benchmarks.gpu.seeded.acceptance --url "$(spec_url)" --admin-key "$(key)" \
        "${DS[@]}" --depths 1,3 --requests 32 --concurrency 8 --off-spell 64 \
        --out "$A/skip-extend.json" 2>&1 | tee "$A/skip-extend.txt"
    off_mode 0
    "$PY" -m benchmarks.gpu.seeded.acceptance --url "$(spec_url)" --admin-key "$(key)" \
        --dataset "$R/models/seeded/family_a.jsonl" --depths 3 --requests 32 --concurrency 8 \
        --off-spell 64 --out "$A/sglang.json" 2>&1 | tee "$A/sglang.txt"
    off_mode 1
    ;;
restart)
    # Both servers again where their launch changed (DEVICE_TIMER, SERVER_ARGS, the harness's
    # options), without rebuilding the models; a server whose launch is the same is kept.
    stamp "servers: restarted where their launch changed"
    "$PY" -m benchmarks.gpu.harness start "${HARNESS_OPTS[@]}" --budget 430
    pack
    ;;
measure)
    stamp "warm pass (not reported): every series at 16 and 128 streams"
    bench "$R/bench_warm" --depths 0,1,3 --no-spec-url "$(plain_url)" --concurrency 16,128 \
        --duration-per-level 2 --warmup-per-level 0.5 >"$R/bench_warm.txt" 2>&1
    stamp "bench: d0 (skip-extend), d1, d3, plain"
    bench "$R/bench" --depths 0,1,3 --no-spec-url "$(plain_url)" 2>&1 | tee "$R/bench.txt"
    stamp "depth 0 again, off mode sglang, then skip-extend"
    off_mode 0
    bench "$R/bench_d0_sglang" --depths 0 2>&1 | tail -12 | tee "$R/bench_d0_sglang.txt"
    off_mode 1
    bench "$R/bench_d0_skip" --depths 0 2>&1 | tail -12 | tee "$R/bench_d0_skip.txt"
    stamp "1,000 on/off switches under load, greedy after"
    "$PY" -m benchmarks.gpu.harness switch "${HARNESS_OPTS[@]}" --budget 200
    ;;
traces)
    POLICIES=${3:?give the policies, e.g. "static:3 sglang daemon"}
    FINAL=${4:-}
    T="$R/trace"; mkdir -p "$T"
    DS=(--dataset "a=$R/models/seeded/family_a.jsonl" --dataset "b=$R/models/seeded/family_b.jsonl")
    for name in $POLICIES; do
        stamp "trace under $name"
        policy=$name; url=$(spec_url); extra=()
        case "$name" in
        plain) url=$(plain_url) ;;
        daemon) policy=daemon; name=daemon-cold ;;
        daemon-warm)  # the daemon again, from the store it learned in the cold run
            policy=daemon; extra=(--daemon-store "$T/daemon-cold.sqlite") ;;
        esac
        "$PY" -m benchmarks.gpu.seeded.trace run --policy "$policy" --name "${name//:/-}" \
            --url "$url" --admin-key "$(key)" "${DS[@]}" --phases "$PHASES" --out "$T" \
            "${extra[@]}" 2>&1 | tee -a "$T/trace.txt"
    done
    "$PY" -m benchmarks.gpu.seeded.trace compare "$T" 2>&1 | tee "$T/compare.txt"
    ;;
parity)
    # The comparison at 64 and 128 streams needs a client that is not the bottleneck: each
    # level's streams are dealt over CLIENTS load-generator processes. Then two more series
    # of depth 0 and the plain server, for the spread between runs of one level.
    CLIENTS=${CLIENTS:-4}
    stamp "warm pass (not reported): every series at 16 and 128 streams"
    bench "$R/bench_warm" --depths 0,1,3 --no-spec-url "$(plain_url)" --concurrency 16,128 \
        --duration-per-level 2 --warmup-per-level 0.5 --client-processes "$CLIENTS" \
        >"$R/bench_warm.txt" 2>&1
    stamp "bench: d0 (skip-extend), d1, d3, plain; $CLIENTS client processes"
    bench "$R/bench" --depths 0,1,3 --no-spec-url "$(plain_url)" --client-processes "$CLIENTS" \
        2>&1 | tee "$R/bench.txt"
    for rep in 1 2; do
        stamp "repeat $rep: d0 (skip-extend) and plain"
        bench "$R/bench_rep$rep" --depths 0 --no-spec-url "$(plain_url)" \
            --client-processes "$CLIENTS" 2>&1 | tail -14 | tee "$R/bench_rep$rep.txt"
    done
    ;;
verify)
    # A spec server started with SPECCTL_VERIFY_SCHEDULE=1 (depth-0 verify with the decode's FA3
    # scheduling, sglang_hooks/verify_schedule.py): outputs first, then depth 0 against the
    # plain server at 1-16 streams twice, 64 and 128 streams in long levels, and the kernels.
    grep -h "flashattention_backend\|verify graphs get\|verify keeps" "$R"/logs/spec*.log | head -5 || true
    stamp "1,000 on/off switches under load, greedy after"
    "$PY" -m benchmarks.gpu.harness switch "${HARNESS_OPTS[@]}" --budget 200
    for rep in 1 2; do
        stamp "d0 and plain at 1-16 streams, series $rep"
        bench "$R/vs_low_rep$rep" --depths 0 --no-spec-url "$(plain_url)" --concurrency 1,4,16 \
            --client-processes 4 2>&1 | tail -9 | tee "$R/vs_low_rep$rep.txt"
    done
    stamp "d0 and plain at 64 and 128 streams, ${LONG_S:-15} s levels"
    bench "$R/vs_high" --depths 0 --no-spec-url "$(plain_url)" --concurrency 64,128 \
        --duration-per-level "${LONG_S:-15}" --warmup-per-level 3 --client-processes 4 2>&1 \
        | tail -8 | tee "$R/vs_high.txt"
    P="$R/profile"; mkdir -p "$P"
    "$PY" -m benchmarks.gpu.kernel_profile capture --url "$(spec_url)" --depth 0 --label d0vs \
        --dataset "$R/models/seeded/family_a.jsonl" --output-tokens 128 --streams 1,16 \
        --out "$P" --trace-dir "${TRACES:-/tmp/gpu-traces}" --admin-key "$(key)" 2>&1 \
        | tee -a "$P/capture.txt"
    ;;
long)
    # At 64 and 128 streams of equal-length requests the streams move in waves (they start,
    # prefill and end together), so a 5 s window sees a different part of a wave each time;
    # LONG_S-second windows average over several, and SPREAD=LOW:HIGH (see `series`) breaks
    # the waves. LONG_DEPTHS (default 0,1,3; "" skips it) for the first bench, then REPS
    # more benches of depth 0 and the plain server, judged pooled (benchmarks/gpu/parity.py).
    CLIENTS=${CLIENTS:-4}; LONG_S=${LONG_S:-15}
    spread_outputs
    LB=(--concurrency 64,128 --duration-per-level "$LONG_S" --warmup-per-level 3
        --client-processes "$CLIENTS" --freeze-gc)
    if [ -n "${LONG_DEPTHS-0,1,3}" ]; then
        stamp "long levels: depths ${LONG_DEPTHS-0,1,3} and plain at 64 and 128 streams, $LONG_S s each"
        bench "$R/bench_long" --depths "${LONG_DEPTHS-0,1,3}" --no-spec-url "$(plain_url)" \
            "${LB[@]}" 2>&1 | tail -14 | tee "$R/bench_long.txt"
    fi
    for rep in $(seq 1 "${REPS:-2}"); do
        stamp "long levels, repeat $rep: d0 and plain"
        bench "$R/bench_long_rep$rep" --depths 0 --no-spec-url "$(plain_url)" "${LB[@]}" 2>&1 \
            | tail -10 | tee "$R/bench_long_rep$rep.txt"
    done
    [ "${REPS:-2}" -gt 0 ] && "$PY" -m benchmarks.gpu.parity "$R"/bench_long_rep[0-9]*/ \
        --json "$R/parity_long.json" | tee "$R/parity_long.txt"
    ;;
trims)
    # The host-work trims' output identity: trims on, then the harness's 1,000 depth switches
    # under load with greedy output against the plain server after. The trims stay on for
    # the steps that follow when it passes, and are switched off again when it does not
    # (trims_check.txt says which).
    lean_host 1
    stamp "1,000 on/off switches under load with the trims on, greedy after"
    # A phase cut by its budget before the 1,000th push fails only "all 1000 pushes sent": the
    # trims stay on then (run 15 turned them off for that alone and benched without them).
    if "$PY" -m benchmarks.gpu.harness switch "${HARNESS_OPTS[@]}" --budget "${SWITCH_BUDGET:-200}"; then
        echo "trims on: switch phase passed (greedy identical, no error, no growth)" \
            | tee "$R/trims_check.txt"
    elif short=$("$PY" -m benchmarks.gpu.switch_verdict "$R/summary.json"); then
        echo "trims on: $short" | tee "$R/trims_check.txt"
    else
        lean_host 0
        echo "trims off again: the switch phase failed (see summary.json phases.switch)" \
            | tee "$R/trims_check.txt"
    fi
    ;;
hostd1)
    # Depth 1 against depth 3 where fits have found depth 1's iteration longer than its GPU
    # timer by several ms (16 and 64 streams): a bench of the two depths at those levels, then
    # the host side of each under SGLang's profiler. Last in a session: profiles slow a server.
    stamp "depths 1 and 3 at 16 and 64 streams"
    bench "$R/bench_d13" --depths 1,3 --concurrency 16,64 --client-processes 4 --freeze-gc 2>&1 \
        | tail -8 | tee "$R/bench_d13.txt"
    P="$R/profile"; mkdir -p "$P"
    for d in 1 3; do
        "$PY" -m benchmarks.gpu.kernel_profile capture --url "$(spec_url)" --depth "$d" \
            --label "d$d" --dataset "$R/models/seeded/family_a.jsonl" --output-tokens 128 \
            --streams 16,64 --steps "${PROFILE_STEPS:-40}" --out "$P" \
            --trace-dir "${TRACES:-/tmp/gpu-traces}" --admin-key "$(key)" --host 2>&1 \
            | tee -a "$P/capture.txt"
    done
    for c in 16 64; do
        [ -f "$P/d1-c$c.json" ] && [ -f "$P/d3-c$c.json" ] || continue
        "$PY" -m benchmarks.gpu.kernel_profile compare "$P/d3-c$c.json" "$P/d1-c$c.json" \
            --top 25 | tee "$P/compare_d3_d1_c$c.txt"
        "$PY" -m benchmarks.gpu.kernel_profile compare --part host_ops "$P/d3-c$c.json" \
            "$P/d1-c$c.json" --top 30 | tee "$P/compare_host_d3_d1_c$c.txt"
    done
    ;;
series)
    # Depth 0 against the plain server in SERIES whole series (1-128 streams, LEVEL_S s levels,
    # four load processes) after a warm pass, judged pooled over every series in $R
    # (benchmarks/gpu/parity.py). Each series is paired (`specctl bench --paired`): at every
    # load, depth 0 and then the plain server on the same requests, so that neither drift
    # between the two halves of a bench nor a different draw of prompts enters the ratio.
    # Both servers' garbage collectors are frozen (SGLang's /freeze_gc) after the warm pass:
    # before that, gen-2 collections of ~950k objects took 0.46-0.57 s in each server's
    # tokenizer process (run 5, logged with SERVER_ARGS "--gc-warning-threshold-secs 0.05"), a
    # TTFT stall for every request waiting then.
    # FREEZE_AFTER=k freezes after series k instead (0 = after the warm pass), "never" not at all.
    # WARM=0 skips the warm pass: for a later call on the same servers, whose series are
    # numbered on from the last one in $R and pooled with them.
    # SPREAD=LOW:HIGH: output lengths drawn over LOW..HIGH instead of all 128, so requests end
    # one by one rather than in waves (the 128-stream levels were bimodal with equal lengths).
    # OUTPUT_LEN=N (no SPREAD): every request N tokens, more than a level decodes, so its
    # window admits nothing and times decode iterations alone (parity.py --decode-only).
    # STREAMS=128 (comma list) benches those levels only, e.g. long ones (LEVEL_S=60) where
    # short series leave the ratio's interval wide; they pool with the full series by level.
    # SERIES_TAG=NAME keeps these series apart (series_NAME_1, ..., parity_NAME.txt), e.g. those
    # of servers restarted with the device timer, which must not pool with the others.
    # ORDER=alternate (default): odd series run d0 first at each load, even ones the plain
    # server first (`--plain-first`), so parity.py can tell an order effect from a gap between
    # the servers; ORDER=spec-first or plain-first for one order throughout.
    # SWAP_CORES=1 (with SPEC_CPUS and PLAIN_CPUS, and a SERIES_TAG to keep them apart): the
    # running servers trade cores for these series (`benchmarks.gpu.cpus repin`, every thread
    # of each server's session, no restart) and trade them back when the step ends: whether a
    # slow depth-0 level follows the speculative server or the cores it ran on.
    FREEZE_AFTER=${FREEZE_AFTER:-0}
    case "${ORDER:=alternate}" in  # checked before the warm pass spends the device's time
        alternate|spec-first|plain-first) ;;
        *) echo "ORDER: expected alternate, spec-first or plain-first, got $ORDER" >&2; exit 2 ;;
    esac
    if [ "${SWAP_CORES:-0}" = 1 ]; then
        if [ -z "${SPEC_CPUS:-}" ] || [ -z "${PLAIN_CPUS:-}" ]; then
            echo "SWAP_CORES=1: set SPEC_CPUS and PLAIN_CPUS, the cores the servers started on" >&2
            exit 2
        fi
        stamp "the servers trade cores: spec on $PLAIN_CPUS, plain on $SPEC_CPUS"
        swap_cores "$PLAIN_CPUS" "$SPEC_CPUS" || exit 1
    fi
    S="$R/series_${SERIES_TAG:+${SERIES_TAG}_}"  # SERIES_TAG=timed: series_timed_1, ... apart
    # With SPREAD, the warm pass and every series draw their own fresh prompts (seed 1000 and
    # the series' number, or the next seed no earlier bench of $R used: `fresh_seed`; the
    # harness's seeded datasets are seed 0).
    warm_pass "${S}warm"
    streams=(); [ -n "${STREAMS:-}" ] && streams=(--concurrency "$STREAMS")
    first=1
    while [ -e "$S$first" ]; do first=$((first + 1)); done
    # The GPU's clocks and the machine's CPUs over every level (benchmarks/gpu/gpu_clocks.py
    # and cpu_log.py cut them by level), stopped however the step ends (a timeout cuts it).
    side_logs "$S"; trap 'side_logs_end "$S"; cores_back' EXIT; trap 'exit 143' TERM
    for rep in $(seq 0 "${SERIES:-3}"); do
        if [ "$rep" = "$FREEZE_AFTER" ]; then
            stamp "freezing both servers' garbage collectors"
            freeze_gc spec; freeze_gc plain
        fi
        [ "$rep" = 0 ] && continue
        n=$((first + rep - 1))
        order_flag=(); who="d0 first"
        if [ "$ORDER" = plain-first ] || { [ "$ORDER" = alternate ] && [ $((n % 2)) = 0 ]; }; then
            order_flag=(--plain-first); who="plain first"
        fi
        stamp "series ${SERIES_TAG:+$SERIES_TAG }$n: d0 and plain at ${STREAMS:-1-128} streams, paired, $who"
        spread_outputs "$(fresh_seed "$n")"
        bench "$S$n" --depths 0 --no-spec-url "$(plain_url)" --paired "${order_flag[@]}" \
            --client-processes 4 --warmup-per-level 2 "${streams[@]}" 2>&1 \
            | tee "$S$n.txt" | tail -14
        pack  # each series comes back even if the command is cut before the pooled verdict
    done
    side_logs_end "$S" "$S"[0-9]*/
    cores_back
    P="$R/parity${SERIES_TAG:+_$SERIES_TAG}"
    "$PY" -m benchmarks.gpu.parity "$S"[0-9]*/ ${OUTPUT_LEN:+--decode-only} --json "$P.json" \
        | tee "$P.txt"
    # Every level in the order it ran, and how each server's passes moved over the series.
    "$PY" -m benchmarks.gpu.timeline "$S"[0-9]*/ --json "${S}timeline.json" >"${S}timeline.txt" \
        && sed -n '/ms per pass over/,$p' "${S}timeline.txt"
    grep -h "LONG GARBAGE\|Freezing GC" "$R"/logs/*.log >"$R/gc_log.txt" 2>/dev/null || true
    echo "$(grep -c "LONG GARBAGE" "$R/gc_log.txt" || true) long collections logged"
    pack
    ;;
lean)
    # Depth 0 with the plugin's host-work trims and without, each against the plain server, in
    # alternating benches on one server start (SERIES pairs, four load processes, collectors
    # frozen after a warm pass), judged pooled per arm (benchmarks/gpu/parity.py). SWITCH=1
    # then runs the 1,000 on/off switches with the trims on, greedy output checked after.
    # SPREAD=LOW:HIGH spreads the output lengths (see `series`).
    spread_outputs
    warm_d0_plain "$R/lean_warm"
    freeze_gc spec; freeze_gc plain
    for rep in $(seq 1 "${SERIES:-2}"); do
        for arm in 0 1; do
            lean_host "$arm"
            stamp "pair $rep, trims $arm: d0 and plain at 1-128 streams"
            bench "$R/lean${arm}_$rep" --depths 0 --no-spec-url "$(plain_url)" \
                --client-processes 4 --warmup-per-level 2 2>&1 | tee "$R/lean${arm}_$rep.txt" \
                | tail -13
        done
    done
    for arm in 0 1; do
        echo "== trims $arm"
        "$PY" -m benchmarks.gpu.parity "$R"/lean${arm}_[0-9]*/ --json "$R/parity_lean$arm.json" \
            | tee "$R/parity_lean$arm.txt"
    done
    if [ "${SWITCH:-0}" = 1 ]; then
        lean_host 1
        stamp "1,000 on/off switches under load with the trims on, greedy after"
        "$PY" -m benchmarks.gpu.harness switch "${HARNESS_OPTS[@]}" --budget 200
    fi
    ;;
context)
    # Depths 0, 1, 3 and the plain server at two prompt lengths on one server start (the family's
    # own prompts, then WORDS-word prompts of the same family, so acceptance stays): the pair
    # `specctl sim fit` needs for the step's growth with context.
    # Collectors frozen by each bench (--freeze-gc, recorded in bench.json; see `series`); each
    # bench is cut at BENCH_TIMEOUT seconds (a
    # run's 512-word bench once took over 470 s for 11 levels, cause not seen).
    # SPREAD=LOW:HIGH spreads both benches' output lengths (see `series`), which `sim fit`
    # replays as spread, and draws the family bench's FRESH prompts (see `spread_outputs`). The
    # long prompts stay 512 joins of the family's: more tokens than a KV pool holds, so each
    # is evicted before it comes round.
    WORDS=${WORDS:-512}; LONG="$R/models/seeded/family_a_w$WORDS.jsonl"
    SPREAD_ARGS=(); FAMILY="$R/models/seeded/family_a.jsonl"
    if [ -n "${SPREAD:-}" ]; then
        SPREAD_ARGS=(--output-tokens "$SPREAD")
        spread_outputs; FAMILY=$DATASET  # each row's own length, FRESH prompts
    fi
    "$PY" -m benchmarks.gpu.seeded.datasets "$R/models/seeded/family_a.jsonl" "$LONG" \
        --words "$WORDS" "${SPREAD_ARGS[@]}"
    # BENCHES="long family" (the default) runs both benches; one of them alone where both do
    # not fit one command (LEVEL_S=15: about 360 s each). A bench of a kind already run goes to
    # a numbered folder (bench_family_2, ...), so repeats (BENCHES="family family", or the step
    # called again) keep each other: `specctl sim fit --pool-repeats` takes them together.
    # "warm" is the family bench into bench_warm: a server's first bench ran its draft paths
    # slower (run 11: depth 1 at one stream 6.4 ms an iteration, then 5.3 in the next two
    # benches), so a session meant for fits starts with one and leaves it out of them.
    packed_before=""  # the folder is packed before each later bench, and at the end below
    for which in ${BENCHES:-long family}; do
        [ -n "$packed_before" ] && pack
        packed_before=1
        case "$which" in
        long) stamp "bench at $WORDS-token prompts: d0, d1, d3, plain"
              data="$LONG"; dir=$(fresh_dir "$R/bench_w$WORDS") ;;
        family) stamp "bench at the family's own prompts: d0, d1, d3, plain"
              data="$FAMILY"; dir=$(fresh_dir "$R/bench_family") ;;
        warm) stamp "warm-up bench (not for fits): d0, d1, d3, plain"
              data="$FAMILY"; dir=$(fresh_dir "$R/bench_warm") ;;
        *) echo "BENCHES: unknown bench $which (long, family, warm)" >&2; exit 2 ;;
        esac
        # Output goes to the file as it comes and the folder is packed after each bench, so a
        # command cut short at the time limit still brings back what finished.
        DATASET="$data" BENCH_TIMEOUT=${BENCH_TIMEOUT:-280} bench "$dir" --depths 0,1,3 \
            --no-spec-url "$(plain_url)" --client-processes 4 --freeze-gc 2>&1 \
            | tee "$dir.txt" | tail -26
    done
    ;;
profile)
    # SGLang's profiler over the same number of iterations on both servers; traces (tens of
    # MB) stay outside $R, the per-kernel summaries and comparisons are packed. HOST=1 also
    # records the host side (aten operators and CUDA runtime calls per iteration).
    # PROFILE_STREAMS (default 1,16,128): the levels where depth 0 and the plain server are
    # both profiled and compared; D13=0 leaves out depths 1 and 3 at 64 streams.
    # PROFILE_OUTPUT (default 128): every request's output tokens; 1 profiles admissions alone
    # (each iteration a prefill). With SPREAD set the prompts are a fresh draw (`fresh_seed`),
    # so neither server replays a prompt its prefix cache holds; without it, the family's 512.
    # PROFILE_TAG=NAME labels the captures d0_NAME / plain_NAME, beside earlier ones.
    # Every capture also records where the GPU idles between kernels; gaps.txt lists them.
    P="$R/profile"; TR=${TRACES:-/tmp/gpu-traces}; mkdir -p "$P"
    STREAMS=${PROFILE_STREAMS:-1,16,128}
    DATASET="$R/models/seeded/family_a.jsonl"; spread_outputs "$(fresh_seed 2000)"
    KP=(--dataset "$DATASET" --output-tokens "${PROFILE_OUTPUT:-128}"
        --steps "${PROFILE_STEPS:-60}" --out "$P" --trace-dir "$TR" --admin-key "$(key)"
        $([ "${HOST:-0}" = 1 ] && echo --host))
    tag=${PROFILE_TAG:+_$PROFILE_TAG}
    "$PY" -m benchmarks.gpu.kernel_profile capture --url "$(spec_url)" --depth 0 \
        --label "d0$tag" "${KP[@]}" --streams "$STREAMS" 2>&1 | tee -a "$P/capture.txt"
    "$PY" -m benchmarks.gpu.kernel_profile capture --url "$(plain_url)" --label "plain$tag" \
        "${KP[@]}" --streams "$STREAMS" 2>&1 | tee -a "$P/capture.txt"
    # At 64 streams the first run's d1 took 4.3 ms an iteration more than its GPU timer saw:
    # the busy share says whether the GPU waited on the host there.
    if [ "${D13:-1}" = 1 ]; then
        for d in 1 3; do
            "$PY" -m benchmarks.gpu.kernel_profile capture --url "$(spec_url)" --depth "$d" \
                --label "d$d" "${KP[@]}" --streams 64 2>&1 | tee -a "$P/capture.txt"
        done
    fi
    for c in ${STREAMS//,/ }; do
        base="$P/plain$tag-c$c.json"; other="$P/d0$tag-c$c.json"
        [ -f "$base" ] && [ -f "$other" ] || continue
        "$PY" -m benchmarks.gpu.kernel_profile compare "$base" "$other" \
            --top 25 | tee "$P/compare$tag""_c$c.txt"
        [ -n "${HOST:-}" ] && "$PY" -m benchmarks.gpu.kernel_profile compare --part host_ops \
            "$base" "$other" --top 25 | tee "$P/compare_host$tag""_c$c.txt"
        for f in "$other" "$base"; do
            "$PY" -m benchmarks.gpu.kernel_profile gaps "$f" --top 8; echo
        done | tee -a "$P/gaps.txt"
    done
    [ -f "$P/d1-c64.json" ] && [ -f "$P/d3-c64.json" ] && "$PY" -m benchmarks.gpu.kernel_profile \
        compare "$P/d1-c64.json" "$P/d3-c64.json" --top 25 | tee "$P/compare_d1_d3_c64.txt"
    ;;
relay)
    # The depth-0 relay trims (lean_relay.py). RELAY_PART=ab (default): depth 0 with the trims
    # off then on, each bench with the plain server beside, RELAY_ROUNDS rounds (default 3) at
    # RELAY_STREAMS (default 1,4,16), after a warm pass at every level and /freeze_gc on both
    # servers; `python -m benchmarks.gpu.parity` over each setting's benches. RELAY_PART=check: trims on, the harness's 1,000 depth switches under load and the
    # greedy check; the trims are switched off again if it fails (relay_check.txt says which).
    spread_outputs
    RL="$R/relay"; mkdir -p "$RL"
    if [ "${RELAY_PART:-ab}" = ab ]; then
        warm_d0_plain "$RL/warm"  # then both servers' collectors frozen
        freeze_gc spec; freeze_gc plain
        for i in $(seq 1 "${RELAY_ROUNDS:-3}"); do
            for v in 0 1; do
                plugin_setting specctl_lean_relay "$v" >/dev/null
                stamp "round $i, relay trims $v"
                bench "$RL/relay${v}_$i" --depths 0 --no-spec-url "$(plain_url)" \
                    --concurrency "${RELAY_STREAMS:-1,4,16}" --client-processes 4 2>&1 \
                    | tail -10 >"$RL/relay${v}_$i.txt"
            done
        done
        curl -sS "$(spec_url)/server_info" >"$RL/server_info_after_ab.json"
        for v in 0 1; do
            "$PY" -m benchmarks.gpu.parity "$RL"/relay${v}_*/bench.json \
                --json "$RL/parity_relay$v.json" 2>&1 | tee "$RL/parity_relay$v.txt"
        done
    else
        plugin_setting specctl_lean_relay 1
        stamp "1,000 on/off switches under load with the relay trims on, greedy after"
        if "$PY" -m benchmarks.gpu.harness switch "${HARNESS_OPTS[@]}" --budget "${SWITCH_BUDGET:-200}"; then
            echo "relay trims on: switch phase passed (greedy identical, no error, no growth)" \
                | tee "$RL/relay_check.txt"
        else
            plugin_setting specctl_lean_relay 0
            echo "relay trims off again: the switch phase failed (see summary.json phases.switch)" \
                | tee "$RL/relay_check.txt"
        fi
        curl -sS "$(spec_url)/server_info" >"$RL/server_info_after_check.json"
    fi
    ;;
hostwatch)
    # Host time under load, depth 0 against the plain server (benchmarks/gpu/host_watch.py): CPU
    # per process of the machine, the cgroup's throttling, and with PYSPY=path the scheduler's
    # stacks, whose shares `stack_share compare` puts side by side. HOST_STREAMS (default 1,4,128),
    # WATCH_S seconds a level (default 8); with SPREAD the spread dataset, else OUTPUT_LEN tokens
    # a request (default 128; one beyond what a level decodes keeps admissions out). A warm pass first
    # (WARM=0: none), or Triton compiles a large batch's kernels inside depth 0's window (run 19:
    # SGLang's slot-assignment kernel for 128 requests, 5.5% of its 128-stream samples).
    warm_pass "$(fresh_dir "$R/host_warm")"
    spread_outputs
    H="$R/host"; mkdir -p "$H"
    STREAMS=${HOST_STREAMS:-1,4,128}
    HW=(--run-dir "$R" --dataset "${DATASET:-$R/models/seeded/family_a.jsonl}" --out "$H"
        --seconds "${WATCH_S:-8}" --streams "$STREAMS" ${PYSPY:+--py-spy "$PYSPY"})
    [ -z "${SPREAD:-}" ] && HW+=(--output-tokens "${OUTPUT_LEN:-128}")
    "$PY" -m benchmarks.gpu.host_watch --server spec --depth 0 "${HW[@]}" 2>&1 | tee -a "$H/watch.txt"
    "$PY" -m benchmarks.gpu.host_watch --server plain "${HW[@]}" 2>&1 | tee -a "$H/watch.txt"
    for c in ${STREAMS//,/ }; do
        [ -f "$H/plain-c$c/stacks.txt" ] && [ -f "$H/d0-c$c/stacks.txt" ] || continue
        "$PY" -m benchmarks.gpu.stack_share compare "$H/plain-c$c/stacks.txt" \
            "$H/d0-c$c/stacks.txt" --top 40 | tee "$H/compare_c$c.txt"
        # Host ms per decode iteration: the two servers ran at different rates.
        "$PY" -m benchmarks.gpu.stack_share compare --busy --per-pass "$H/plain-c$c/stacks.txt" \
            "$H/d0-c$c/stacks.txt" --top 45 >"$H/per_pass_c$c.txt"
        for who in plain d0; do
            "$PY" -m benchmarks.gpu.stack_share show "$H/$who-c$c/stacks.txt" --top 60 \
                >"$H/$who-c$c/shares.txt"
        done
    done
    ;;
offspell)
    # What a request admitted while off loses in acceptance when drafting resumes, with the
    # draft's prefill skipped at admission (the `specctl serve` default) and with it run:
    # the same requests off for their first 64 tokens and depth 3 after, then at depth 3
    # throughout, compared over the same tokens (benchmarks/gpu/seeded/acceptance.py
    # --off-spell, which scrubs the draft's KV slots and flushes before each arm), both
    # settings in each of OFFSPELL_ROUNDS rounds (default 3; one round of 8 requests resolves
    # about 0.05), each round on 16 prompts of its own (greedy requests repeated would repeat
    # their accept lengths), pooled by off_spell_pool. The skip is left on.
    A="$R/acceptance"; mkdir -p "$A"
    for i in $(seq 1 "${OFFSPELL_ROUNDS:-3}"); do
        for skip in 1 0; do
            stamp "round $i: off spell of 64 tokens, then depth 3; draft prefill skipped while off: $skip"
            plugin_setting specctl_skip_draft_prefill "$skip"
            "$PY" -m benchmarks.gpu.seeded.acceptance --url "$(spec_url)" --admin-key "$(key)" \
                --dataset "$R/models/seeded/family_a.jsonl" --depths 3 --requests 32 \
                --concurrency 8 --off-spell 64 --off-spell-from $(((i - 1) * 16)) \
                --out "$A/prefill_skip_${skip}_$i.json" 2>&1 \
                | tee "$A/prefill_skip_${skip}_$i.txt"
        done
    done
    plugin_setting specctl_skip_draft_prefill 1
    "$PY" -m benchmarks.gpu.seeded.off_spell_pool --setting skip1 "$A"/prefill_skip_1_*.json \
        --setting skip0 "$A"/prefill_skip_0_*.json --json "$A/pooled.json" | tee "$A/pooled.txt"
    ;;
*)
    echo "unknown step $STEP: setup, restart, measure, traces, parity, profile, long, verify, series, lean, context, trims, hostd1, hostwatch, relay or offspell" >&2
    exit 2 ;;
esac
pack
exit "$failed"
