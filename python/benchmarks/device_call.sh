#!/bin/bash
# The next device call for issue 21, in one go (spec_decode_attn.md, "The query in registers
# measured, and int8 KV verify attention served"). On this machine first:
#   .venv/bin/python python/benchmarks/pack_device_tree.py     # -> .device/sda-tree.tar.xz
# then run `bash python/benchmarks/device_call.sh` on the device, carrying [".device"].
# Everything it writes comes back as one tarball, $OUT/r.tar.xz, re-made after each step
# (a call returns only a few files, and a call cut off at its limit keeps the last one).
# Steps, most needed first:
#   sda_batch  the series' int8 Hopper pass as vLLM dispatches it, stock beside it, at batches
#              of 1 and 4 requests (a timed batch of several requests: not yet measured)
#   chunks16   the candidate at q = 16 with the straight run and with 4 chunks, side by side
#              (measured on H100s in sessions 26 to 28, not yet on an H200)
#   cand       the candidate's record with its current default (tests/gpu/
#              int8_candidate_result.json: copy cand.json there when its five tests skip
#              because the device work changed; the record made in session 27 is current)
# (session 28 ran --q-regs here, side by side: slower at every context; spec_decode_attn.md)
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
LIM=300 TAILN=30 step sda_batch python3 benchmarks/spec_decode_attn.py --tree "$T" \
  --out "$W/sda" --kv int8 --batches 1,4 --contexts 16384,65536,131072 --queries 8,16 \
  --budget 250 --json "$W/sda-batch.json"
A=(--tree "$T" --int8-qk 2 --v-tile fp16 --contexts 2048,16384,65536,131072 --queries 16
   --lazy 1)
for ch in 1 4; do
  step "chunks16_c$ch" python3 benchmarks/int8_ws_candidate.py "${A[@]}" --q-chunks "$ch" \
    --json "$W/chunks16_c$ch.json"
done
LIM=300 TAILN=3 step cand python3 benchmarks/int8_ws_candidate.py --tree "$T" \
  --json "$W/cand.json"
