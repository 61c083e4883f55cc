#!/usr/bin/env bash
# Runs ON the GPU machine, from the checkout's root, after `source DIR/stage.sh DIR env`: one
# harness command that outlasts a device call (10 minutes at most) runs in its own session,
# and each call waits on it for a while, then packs what the run folder holds into $OUT.
#   bash benchmarks/gpu/staging/background.sh start SECONDS -- STEP... --run-dir DIR [options]
#   bash benchmarks/gpu/staging/background.sh wait SECONDS DIR
# Calls must follow each other within the machine's idle release (about 30 s). The command's
# output goes to DIR/background.log, copied to $OUT at each return; DIR/background.done marks
# its end. Why: each call a shapes or trace step is split into pays the gap between the last
# part that fits and the call's limit; one command in the background wastes none of it.
set -u
what=${1:?usage: background.sh start SECONDS -- ARGS | wait SECONDS DIR}
seconds=${2:?usage: background.sh start SECONDS -- ARGS | wait SECONDS DIR}
wait_and_pack() {  # $1: the run folder, $2: until (epoch seconds)
  until [ "$(date +%s)" -ge "$2" ] || [ -f "$1/background.done" ]; do sleep 5; done
  tail -40 "$1/background.log"
  python3 - "$1" <<'PY'
import os, sys
from pathlib import Path
from benchmarks.gpu.pack import pack
r = pack(Path(sys.argv[1]), Path(os.environ["OUT"]) / "run.tar.gz")
print("packed", r["bytes"], "bytes,", r["files"], "files")
PY
  cp "$1/background.log" "$OUT/" 2>/dev/null
  [ -f "$1/background.done" ] && echo "background: done" || echo "background: still running"
}
case $what in
start)
  shift 2; [ "${1:-}" = "--" ] && shift
  dir=""; prev=""
  for a in "$@"; do [ "$prev" = "--run-dir" ] && dir=$a; prev=$a; done
  [ -n "$dir" ] || { echo "background: give --run-dir DIR"; exit 2; }
  mkdir -p "$dir"; rm -f "$dir/background.done"
  printf -v cmd '%q ' "$@"
  setsid nohup bash -c "python -m benchmarks.gpu $cmd; touch $dir/background.done" \
    > "$dir/background.log" 2>&1 < /dev/null &
  wait_and_pack "$dir" $(( $(date +%s) + seconds ))
  ;;
wait)
  wait_and_pack "${3:?usage: background.sh wait SECONDS DIR}" $(( $(date +%s) + seconds ))
  ;;
*) echo "usage: background.sh start SECONDS -- ARGS | wait SECONDS DIR"; exit 2 ;;
esac
