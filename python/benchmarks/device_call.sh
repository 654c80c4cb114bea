#!/bin/bash
# The next device call for issue 21, in one go. On this machine first:
#   .venv/bin/python python/benchmarks/pack_device_tree.py     # -> .device/sda-tree.tar.xz
# then run `bash python/benchmarks/device_call.sh` on the device, carrying [".device"].
# Everything it writes comes back as one tarball, $OUT/r.tar.xz, re-made after each step
# (a call returns only a few files, and a call cut off at its limit keeps the last one).
# Steps, most needed first (a short call keeps what finished):
#   tail      the fused merge's tail parts timed alone (fused_tail.py): empty launches,
#             the barrier, the merge, both, and the series' reduce pass, q = 4, 8, 16
#   inkernel  the same merge's parts inside the int8 Hopper pass (fused_tail.py --in-kernel):
#             split pass alone, cooperative launch only, barrier only, merge only, fused
#   worker    the series' split passes checked on the GPU against the float32 reference;
#             every int8 case also with the other merge of the int8 Hopper pass's partials
#             (while the series keeps the reduce pass: fused, a cooperative launch,
#             repeated bit for bit, counters left at 0)
#   sda1      the series as vLLM dispatches it, against stock, q = 4, 8 and 16, batch 1:
#             the cells issue 21's targets are set in (they are set for the H200); each
#             cell checks its output against the float32 reference, and where the int8
#             Hopper pass can merge its own partials times the other choice right after
#   sda4      the same at batch 4, 16k and 64k (eight segments a request)
#   sda2      sda1 again, for the spread between two runs of one build
# Session 34 ran the previous form of this call on an H100; session 36 wrote this one,
# and session 37 ran its steps worker, sda1 and sda4 on an H100; session 38 added tail and inkernel.
set -u
cd "$(dirname "$0")/../.."
W=$(mktemp -d)
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > "$W/gpu.txt"
python3 -c 'import torch, triton; print(torch.__version__, triton.__version__)' >> "$W/gpu.txt"
cat "$W/gpu.txt"
T=$(mktemp -d) && tar xJf .device/sda-tree.tar.xz -C "$T"
cd python
finish() { (cd "$W" && tar cJf "$OUT/r.tmp" . && mv "$OUT/r.tmp" "$OUT/r.tar.xz"); }
STEPS=" ${STEPS:-tail inkernel worker sda1 sda4 sda2} "   # STEPS="sda1" runs that step alone
for s in $STEPS; do
  [[ " tail inkernel worker sda1 sda4 sda2 " == *" $s "* ]] || { echo "STEPS: no step '$s'" >&2; exit 2; }
done
step() {
  local name=$1 t0; t0=$(date +%s); shift
  [[ $STEPS == *" $name "* ]] || return 0
  echo "=== $name: $*"
  timeout "${LIM:-240}" "$@" > "$W/$name.log" 2>&1
  echo "=== $name rc=$? $(( $(date +%s) - t0 ))s"
  finish
  grep -v '^INFO\|^WARNING' "$W/$name.log" | tail -n "${TAILN:-6}" | cut -c1-400
}
LIM=120 TAILN=24 step tail python3 benchmarks/fused_tail.py --tree "$T" --json "$W/tail.json"
LIM=420 TAILN=14 step inkernel python3 benchmarks/fused_tail.py --tree "$T" --in-kernel \
  --contexts 16384,65536 --json "$W/inkernel.json"
S=(--kv int8 --contexts 16384,65536,131072 --budget 110 --queries 4,8,16)
LIM=180 TAILN=4 step worker python3 tests/patch/spec_decode_worker.py --tree "$T" \
  --out "$W/worker.json" --device cuda --skip-dispatch
LIM=180 TAILN=26 step sda1 python3 benchmarks/spec_decode_attn.py --tree "$T" \
  --out "$W/sda1" "${S[@]}" --batches 1 --json "$W/sda1.json"
LIM=150 TAILN=12 step sda4 python3 benchmarks/spec_decode_attn.py --tree "$T" \
  --out "$W/sda4" --kv int8 --contexts 16384,65536 --budget 90 --queries 8,16 --batches 4 \
  --json "$W/sda4.json"
LIM=180 TAILN=14 step sda2 python3 benchmarks/spec_decode_attn.py --tree "$T" \
  --out "$W/sda2" "${S[@]}" --batches 1 --json "$W/sda2.json"
