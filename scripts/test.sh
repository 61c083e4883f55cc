#!/usr/bin/env bash
# Install specctl with its test tools into .venv and run lint, type checks and the test suite.
# Idempotent and safe on a fresh clone; re-runs reuse the venv.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
VENV=.venv
if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install -q --upgrade pip >/dev/null
"$VENV/bin/python" -m pip install -q -e '.[dev]'

# The SGLang plugin's tests build and use their own venv; they run in the background, beside
# lint, type checks and the main suite (the install waits mostly on downloads), and report at
# the end. PLUGIN_LOG holds their output.
PLUGIN_LOG=.cache/plugin-tests.log
mkdir -p .cache
plugin_tests() {
  # SGLang plugin tests: the real sglang 0.5.23 wheel (no GPU packages) in a separate venv, so
  # the default install stays light. Cached: skipped when .venv-sglang already has the pins.
  # Torch is pinned to the CPU build in every step (an unpinned resolve pulls the CUDA build).
  SGL_VENV=.venv-sglang
  SGL_SRC17=.cache/sglang-0.5.17/sglang
  SGL_LOG=.cache/sglang-venv.log
  mkdir -p .cache
  echo "torch==2.13.0" > .cache/sglang-constraints.txt
  if ! "$SGL_VENV/bin/python" - <<'PY' 2>/dev/null
import importlib.metadata as m
assert m.version("sglang") == "0.5.23" and m.version("torch").startswith("2.13.0")
assert m.version("xgrammar") == "0.2.7" and m.version("specctl")
PY
  then
    echo "== installing $SGL_VENV (sglang 0.5.23 on CPU torch; log: $SGL_LOG)"
    start=$SECONDS
    rm -rf "$SGL_VENV"
    "$PY" -m venv "$SGL_VENV"
    sgl_pip() { "$SGL_VENV/bin/python" -m pip install -q -c .cache/sglang-constraints.txt "$@" >>"$SGL_LOG" 2>&1 || { tail -40 "$SGL_LOG"; exit 1; }; }
    sgl_pip --upgrade pip
    sgl_pip torch==2.13.0
    sgl_pip --no-deps sglang==0.5.23 xgrammar==0.2.7
    # What the imported SGLang modules need, pure Python or CPU wheels only; never
    # sglang-kernel, flashinfer, triton or torchvision (tests/sglang/standins.py covers those).
    sgl_pip numpy orjson psutil pybase64 requests packaging pillow starlette msgspec pydantic \
      pyzmq tqdm ipython aiohttp transformers tokenizers==0.23.2 dill sentencepiece==0.2.1 \
      compressed-tensors==0.18.0 gguf openai==2.8.0 partial-json-parser apache-tvm-ffi==0.1.11 \
      einops setproctitle uvicorn fastapi uvloop soundfile==0.13.1 python-multipart \
      prometheus-client jsonschema
    sgl_pip -e '.[dev]'  # registers the sglang.srt.plugins entry point for real
    echo "   installed in $((SECONDS - start)) s"
  fi
  if [ ! -f "$SGL_SRC17/_version.py" ]; then
    # 0.5.17's source, unpacked and never installed: the guard's signature check runs on it.
    rm -rf .cache/sglang-0.5.17 && mkdir -p .cache/sglang-0.5.17
    "$SGL_VENV/bin/python" -m pip download -q --no-deps sglang==0.5.17 -d .cache/sglang-0.5.17 \
      >>"$SGL_LOG" 2>&1 || { tail -20 "$SGL_LOG"; exit 1; }
    "$SGL_VENV/bin/python" -m zipfile -e .cache/sglang-0.5.17/sglang-0.5.17-*.whl .cache/sglang-0.5.17
  fi
  echo "== pytest (SGLang plugin against sglang 0.5.23)"
  # Own interpreter and --confcutdir: the plugin's patches to SGLang cannot be undone, and
  # prometheus_client must start in multiprocess mode, before any other conftest imports it.
  SPECCTL_SGLANG17_SRC="$PWD/$SGL_SRC17" "$SGL_VENV/bin/python" -m pytest -q -p no:cacheprovider \
    --confcutdir=tests/sglang -W ignore::UserWarning tests/sglang/test_real_*.py
}
plugin_tests >"$PLUGIN_LOG" 2>&1 &
plugin_pid=$!

echo "== ruff"
"$VENV/bin/ruff" check .
echo "== mypy"
"$VENV/bin/mypy"
echo "== pytest"
# Workers: the tests mostly wait on servers and subprocesses, so more workers than cores pay.
# Tests that run a program in .venv-sglang (marker sglang_venv) wait for it to be ready.
main_rc=0
"$VENV/bin/python" -m pytest -n "${PYTEST_WORKERS:-4}" -m "not sglang_venv" "$@" || main_rc=$?

plugin_rc=0
wait "$plugin_pid" || plugin_rc=$?
cat "$PLUGIN_LOG"
client_rc=0
if [ "$plugin_rc" = 0 ]; then
  echo "== pytest (programs in .venv-sglang: SGLang's own client, torch)"
  "$VENV/bin/python" -m pytest -n 2 -m sglang_venv "$@" || client_rc=$?
else
  echo "== the SGLang plugin's venv or tests failed (exit $plugin_rc); SGLang's client not run"
fi
for rc in "$main_rc" "$plugin_rc" "$client_rc"; do [ "$rc" = 0 ] || exit "$rc"; done
