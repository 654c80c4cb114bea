#!/bin/bash
# The next device call for issue 21, in one go (spec_decode_attn.md, "The scales handed over by
# the widener, V scaled as it is widened, and the query's padded rows skipped"). On this
# machine first:
#   .venv/bin/python python/benchmarks/pack_device_tree.py     # -> .device/sda-tree.tar.xz
# then run `bash python/benchmarks/device_call.sh` on the device, carrying [".device"].
# Everything it writes comes back as one tarball, $OUT/r.tar.xz, re-made after each step
# (a call returns only a few files, and a call cut off at its limit keeps the last one).
# It is meant for an H200, where the consumer bounds a q = 8 tile; on an H100 the full runs
# sit at the copy rate and only the compute-only rows compare consumers. Steps, most needed
# first:
#   q8_*      the candidate at q = 8: the default, then --scales widener --qk-wait once
#             --v-scaled, with the widener releasing its stage late and early (session 31
#             measured the first two on H100s only; the early release has not run), full
#             runs and then compute-only
#   chunks16  the candidate at q = 16 with the straight run and with 4 chunks, side by side
#             (measured on H100s in sessions 26 to 30, not yet on an H200)
#   cand      the candidate's record with its current default (tests/gpu/
#             int8_candidate_result.json: copy cand.json there when its five tests skip
#             because the device work changed; the record made in session 27 is current)
# (session 29 ran the series' batch of four requests here; session 28 --q-regs: slower)
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
Q8=(--tree "$T" --int8-qk 2 --v-tile fp16 --contexts 2048,16384,65536,131072 --queries 8
    --lazy 0)
VS=(--scales widener --qk-wait once --v-scaled)
for m in "" "--diagnose compute-only"; do
  t=${m:+co}
  step "q8${t}_default" python3 benchmarks/int8_ws_candidate.py "${Q8[@]}" $m \
    --json "$W/q8${t}_default.json"
  step "q8${t}_vs" python3 benchmarks/int8_ws_candidate.py "${Q8[@]}" "${VS[@]}" $m \
    --json "$W/q8${t}_vs.json"
  step "q8${t}_vse" python3 benchmarks/int8_ws_candidate.py "${Q8[@]}" "${VS[@]}" \
    --widener-release early $m --json "$W/q8${t}_vse.json"
done
A=(--tree "$T" --int8-qk 2 --v-tile fp16 --contexts 2048,16384,65536,131072 --queries 16
   --lazy 1)
for ch in 1 4; do
  step "chunks16_c$ch" python3 benchmarks/int8_ws_candidate.py "${A[@]}" --q-chunks "$ch" \
    --json "$W/chunks16_c$ch.json"
done
LIM=300 TAILN=3 step cand python3 benchmarks/int8_ws_candidate.py --tree "$T" \
  --json "$W/cand.json"
