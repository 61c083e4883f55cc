#!/usr/bin/env bash
# Runs ON the GPU machine, from the checkout's root. DIR is the folder pack.sh filled.
#   bash DIR/stage.sh DIR keep      copy the parts carried in this call to /tmp/w
#   source DIR/stage.sh DIR env     (every part kept) unpack once into /tmp/site, register the
#                                   checkout's plugin and commands, export PYTHONPATH and PATH
# /tmp/w and /tmp/site live only while the machine stays up (about 30 s idle): the calls must
# follow each other at once. STAGE_ROOT (default /tmp) moves w/, site/ and bin/ elsewhere.
dir=${1:?usage: stage.sh DIR keep|env}
what=${2:?usage: stage.sh DIR keep|env}
root=${STAGE_ROOT:-/tmp}
mkdir -p "$root/w"
case $what in
keep)
  cp "$dir"/s[0-9]*/site.tar.xz.* "$root/w/" 2>/dev/null
  ls "$root/w" | tr '\n' ' '; echo
  ;;
env)
  if [ ! -f "$root/site/.done" ]; then
    cp "$dir"/s[0-9]*/site.tar.xz.* "$root/w/" 2>/dev/null
    mkdir -p "$root/site" "$root/bin"
    threads=(); xz -T0 --version >/dev/null 2>&1 && threads=(-T0)  # an old xz lacks -T
    cat "$root"/w/site.tar.xz.* 2>/dev/null | xz -d "${threads[@]}" | tar -xf - -C "$root/site"
    unpacked=("${PIPESTATUS[@]}")  # a cut stream fails xz even where tar stops quietly
    if [ "${unpacked[1]}" != 0 ] || [ "${unpacked[2]}" != 0 ]; then
      echo "stage: parts missing or broken (have: $(ls "$root/w" | tr '\n' ' ')): carry s1.. in order"
      return 1 2>/dev/null || exit 1
    fi
    # The checkout itself is the specctl package: its metadata with the SGLang plugin entry
    # point, and a wrapper per console script, from one read of pyproject.toml.
    STAGE_SITE="$root/site" STAGE_BIN="$root/bin" python3 - <<'PY'
import os, tomllib
project = tomllib.load(open("pyproject.toml", "rb"))["project"]
scripts = project.get("scripts", {})
info = os.path.join(os.environ["STAGE_SITE"], "specctl-0.0.0.dist-info")
os.makedirs(info, exist_ok=True)
with open(os.path.join(info, "METADATA"), "w") as f:
    f.write("Metadata-Version: 2.1\nName: specctl\nVersion: 0.0.0\n")
groups = {**project.get("entry-points", {}), "console_scripts": scripts}
with open(os.path.join(info, "entry_points.txt"), "w") as f:
    for group, items in groups.items():
        f.write(f"[{group}]\n" + "".join(f"{k} = {v}\n" for k, v in items.items()) + "\n")
for name, target in scripts.items():
    module, func = target.split(":")
    path = os.path.join(os.environ["STAGE_BIN"], name)
    with open(path, "w") as f:
        f.write(f"#!/usr/bin/env python3\nimport sys\nfrom {module} import {func} as _m\nsys.exit(_m())\n")
    os.chmod(path, 0o755)
PY
    touch "$root/site/.done"
  fi
  export PYTHONPATH="$PWD:$root/site" PATH="$root/bin:$PATH"
  export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1
  python3 -c 'import importlib.metadata as m; print("sglang", m.version("sglang"), "| plugins:", [e.name for e in m.entry_points(group="sglang.srt.plugins")])'
  ;;
esac
