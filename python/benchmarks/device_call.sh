#!/bin/bash
# The next device call for issue 21, in one go (spec_decode_attn.md, "The one-warpgroup
# path in the series"). On this machine first:
#   .venv/bin/python python/benchmarks/pack_device_tree.py     # -> .device/sda-tree.tar.xz
# and the tree of the series before session 32 (from a checkout of commit d57806b):
#   .venv/bin/python python/benchmarks/pack_device_tree.py --out .device/sda-tree-old.tar.xz
# then run `bash python/benchmarks/device_call.sh` on the device, carrying [".device"].
# Everything it writes comes back as one tarball, $OUT/r.tar.xz, re-made after each step
# (a call returns only a few files, and a call cut off at its limit keeps the last one).
# Steps, most needed first:
#   worker    the series' split passes checked on the GPU against the float32 reference
#             (every int8 case: q = 4 and 8 take the one-warpgroup path session 32 changed)
#   sda_new   the series as vLLM dispatches it, against stock, q = 4, 8 and 16
#   sda_old*  the series before session 32 at q = 4 and 8, alternating with the series now
#   q8_*      the candidate at q = 8, its default and the series' one-warpgroup flags
# Session 32 ran worker, sda_new and sda_old1 on an H100 (the call was cut at 200 s); it is
# meant next for an H200, where the consumer bounds a q = 8 tile and the targets are set.
# (session 31 ran the candidate's options; session 26 the chunked query at q = 16)
set -u
cd "$(dirname "$0")/../.."
W=$(mktemp -d)
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > "$W/gpu.txt"
python3 -c 'import torch, triton; print(torch.__version__, triton.__version__)' >> "$W/gpu.txt"
cat "$W/gpu.txt"
T=$(mktemp -d) && tar xJf .device/sda-tree.tar.xz -C "$T"
cd python
finish() { (cd "$W" && tar cJf "$OUT/r.tmp" . && mv "$OUT/r.tmp" "$OUT/r.tar.xz"); }
step() {
  local name=$1 t0; t0=$(date +%s); shift
  echo "=== $name: $*"
  timeout "${LIM:-240}" "$@" > "$W/$name.log" 2>&1
  echo "=== $name rc=$? $(( $(date +%s) - t0 ))s"
  finish
  grep -v '^INFO\|^WARNING' "$W/$name.log" | tail -n "${TAILN:-6}" | cut -c1-400
}
T0=$(mktemp -d) && tar xJf ../.device/sda-tree-old.tar.xz -C "$T0"
LIM=150 TAILN=12 step worker python3 tests/patch/spec_decode_worker.py --tree "$T" \
  --out "$W/worker.json" --device cuda --skip-dispatch
S=(--kv int8 --batches 1 --contexts 16384,65536,131072 --budget 110)
LIM=150 TAILN=12 step sda_new python3 benchmarks/spec_decode_attn.py --tree "$T" \
  --out "$W/sda_new" "${S[@]}" --queries 4,8,16 --json "$W/sda_new.json"
for r in 1 2; do
  LIM=120 TAILN=8 step "sda_old$r" python3 benchmarks/spec_decode_attn.py --tree "$T0" \
    --out "$W/sda_old$r" "${S[@]}" --queries 4,8 --json "$W/sda_old$r.json"
  LIM=120 TAILN=8 step "sda_new$r" python3 benchmarks/spec_decode_attn.py --tree "$T" \
    --out "$W/sda_new$r" "${S[@]}" --queries 4,8 --json "$W/sda_new$r.json"
done
Q8=(--tree "$T" --int8-qk 2 --v-tile fp16 --contexts 2048,16384,65536,131072 --queries 8
    --lazy 0)
step q8_default python3 benchmarks/int8_ws_candidate.py "${Q8[@]}" --json "$W/q8_default.json"
step q8_series python3 benchmarks/int8_ws_candidate.py "${Q8[@]}" --scales widener \
  --qk-wait once --v-scaled --widener-release early --json "$W/q8_series.json"
