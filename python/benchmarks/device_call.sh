#!/bin/bash
# The next device call for issue 21, in one go (spec_decode_attn.md, "The query rounded on
# the FP32 pipe, measured"). On this machine first:
#   .venv/bin/python python/benchmarks/pack_device_tree.py     # -> .device/sda-tree.tar.xz
# then run `bash python/benchmarks/device_call.sh` on the device, carrying [".device"].
# Everything it writes comes back as one tarball, $OUT/r.tar.xz, re-made after each step
# (a call returns only a few files, and a call cut off at its limit keeps the last one).
# Steps, most needed first:
#   sda_int8   the series' int8 Hopper pass as vLLM dispatches it, stock beside it
#   sweep3090  the RTX 3090's int8 plan at full shape: its error against float32
#   c_noq_q16  q = 16 without its query load: is the 14 us query phase the load?
#   c_smem_q16 q = 16 storing its partials through shared memory
#   cand       the candidate's record with its current default (tests/gpu/
#              int8_candidate_result.json; its five tests skip until it is re-made)
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
LIM=200 TAILN=24 step sda_int8 python3 benchmarks/spec_decode_attn.py --tree "$T" \
  --out "$W/sda" --kv int8 --batches 1 --contexts 16384,65536,131072 --queries 8,16 \
  --budget 150 --json "$W/sda-int8.json"
TAILN=30 step sweep3090 python3 benchmarks/spec_decode_attn.py --tree "$T" --out "$W/sda8" \
  --sweep-8bit --sweep-8bit-kv int8 --sweep-8bit-no-grid --sweep-8bit-switches rtx3090 \
  --sweep-8bit-queries 8,16 --contexts ""
A=(--tree "$T" --int8-qk 2 --v-tile fp16 --contexts 2048,16384,65536,131072 --queries 16
   --lazy 1)
step c_noq_q16 python3 benchmarks/int8_ws_candidate.py "${A[@]}" --diagnose no-query-load \
  --json "$W/c_noq_q16.json"
step c_smem_q16 python3 benchmarks/int8_ws_candidate.py "${A[@]}" --epilogue smem \
  --json "$W/c_smem_q16.json"
LIM=300 TAILN=3 step cand python3 benchmarks/int8_ws_candidate.py --tree "$T" \
  --json "$W/cand.json"
