#!/usr/bin/env bash
# The patched vLLM serving on the lent GPU machine: the command of the end-to-end GPU tier.
#
# The bundle (serve_bundle.py) travels in two device calls, because the compiled core alone
# is 57 MB compressed and a call carries 64 MiB: the second call must come while the machine
# is still warm (30 s after the first returns), so that what the first unpacked is still there.
#   call 1, carry [".device/gpue2e-so"]:
#     mkdir -p /tmp/gpue2e-run/tree && tar -xJf .device/gpue2e-so/so-core.tar.xz -C /tmp/gpue2e-run/tree
#   call 2, carry [".device/gpue2e"], timeout ~470 s:
#     BUDGET_S=390 bash .device/gpue2e/serve_on_device.sh
#   or, for the DFlash2 lives (lookup off, lookup + adaptive block, lookup), call 2 is:
#     SPEC=dflash2 BUDGET_S=420 bash .device/gpue2e/serve_on_device.sh
#   a life whose cold boot outgrew its call is run alone in a later call, the lives served
#   earlier carried over from that call's record (same series only):
#     SPEC=dflash2 RESUME=.device/gpue2e/earlier.json BOOT_TIMEOUT_S=420 BUDGET_S=500 ...
#   or, for the CTX=long lives (issue 21: int8 KV on TRITON_ATTN, the split-KV verify pass,
#   the stock kernel, then the split pass with the Hopper pass turned off; the 27B's
#   attention widths so that sm_90 takes the int8 Hopper pass), call 2 is:
#     SPEC=dflash2 LIFE_CTX=long SHAPE=27b BOOT_TIMEOUT_S=330 BUDGET_S=530 \
#       bash .device/gpue2e/serve_on_device.sh
#   or, for the KVarN life (issue 24: the kvarn cache, no speculator), call 2 is:
#     LIFE_KV=kvarn SPEC=off BUDGET_S=400 bash .device/gpue2e/serve_on_device.sh
#   which first drives the KVARN backend's builder and forward over the patch tier's token
#   stream with the compiled kernels ($OUT/kvarn_stream.pt, for test_patch_kvarn_backend.py;
#   LIFE_KV_PROBE=0 skips it). SPEC=mtp instead serves MTP with its drafter on the kvarn cache.
#   The KVarN lives serve the plan's rows: CTX=huge single-user, or PROFILE=batch (KV=kvarn,
#   SPEC=off). SHAPE=27b first gives the demo model the 27B's widths (shape27b.py; LAYERS=8).
# It unpacks the rest, records the machine and the imports, adds the MTP head to the demo
# model (SPEC=mtp) or a looping LM head and a random DFlash2 drafter (SPEC=dflash2), serves it
# through `qwen3090 serve` with CUDA graphs (exercise_server.py) and writes $OUT/result.json
# plus each server life's log. DRY=1 runs it here without a GPU: unpack, import checks, the
# serve plan (each life's, for SPEC=dflash2); no server.
set -u -o pipefail
ROOT=$(pwd)
BUNDLE=${BUNDLE:-$ROOT/.device/gpue2e}
SO_DIR=${SO_DIR:-$ROOT/.device/gpue2e-so}
OUT=${OUT:-$(mktemp -d)}
WORK=${WORK:-/tmp/gpue2e-run}
SPEC=${SPEC:-mtp}
LIFE_KV=${LIFE_KV:-default}
PROFILE=${PROFILE:-single-user}
SHAPE=${SHAPE:-demo}
LIFE_CTX=${LIFE_CTX:-default}
BUDGET_S=${BUDGET_S:-400}
PY=${PY:-python3}
mkdir -p "$WORK" "$OUT"
BASE=$WORK/base.json
note() { echo "serve_on_device: $*" >&2; }

# 1. the patched vLLM python tree, the compiled core, the carried dependencies
t0=$(date +%s)
if [ ! -f "$WORK/tree/vllm/__init__.py" ]; then
  mkdir -p "$WORK/tree" && tar -xJf "$BUNDLE/tree.tar.xz" -C "$WORK/tree" || exit 2
fi
if [ ! -f "$WORK/tree/vllm/_C_stable_libtorch.abi3.so" ]; then
  for so in "$SO_DIR/so-core.tar.xz" "$BUNDLE/so-core.tar.xz"; do
    [ -f "$so" ] && tar -xJf "$so" -C "$WORK/tree" && break
  done
fi
if [ ! -d "$WORK/site" ]; then
  mkdir -p "$WORK/site" && tar -xJf "$BUNDLE/site.tar.xz" -C "$WORK/site" || exit 2
fi
# FlashAttention-3's 153 MB extension does not fit the 64 MiB a call carries beside the core;
# vllm.vllm_flash_attn refuses to import without an FA extension, and fa_utils imports it on
# every CUDA start even under TRITON_ATTN. An empty module stands in: it makes the import
# succeed and provides no op, so any FA3 call fails loudly instead of running something else.
FA3="$WORK/tree/vllm/vllm_flash_attn/_vllm_fa3_C.py"
[ -f "$WORK/tree/vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so" ] || \
  echo '"""gpue2e stand-in: no FlashAttention-3 ops (TRITON_ATTN serves)."""' > "$FA3"
SITE=$WORK/site
# The dry run here has another Python than the carried cp312 wheels: its own packages serve.
[ "${DRY:-0}" = 1 ] && SITE=
export PYTHONPATH="$BUNDLE/probe:$SITE:$WORK/tree:$ROOT/python"
export PYTHONUNBUFFERED=1 VLLM_NO_USAGE_STATS=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
note "unpacked in $(( $(date +%s) - t0 )) s"

# 2. what the machine is, and whether the tree imports (recorded even when the server fails)
"$PY" - "$BASE" "$SO_DIR" <<'EOF'
import json, os, subprocess, sys, traceback
rec = {"python": sys.version.split()[0], "so_core": "absent", "fa3": "stand-in module"}
try:
    import torch
    rec["torch"] = torch.__version__
    rec["cuda_available"] = torch.cuda.is_available()
    rec["gpu"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
except Exception as e:
    rec["torch_error"] = repr(e)
try:
    import triton
    rec["triton"] = triton.__version__
except Exception as e:
    rec["triton_error"] = repr(e)
import importlib.util
if importlib.util.find_spec("vllm._C_stable_libtorch") is not None:
    rec["so_core"] = "present"
for mod in ("vllm", "vllm._C_stable_libtorch", "vllm.platforms", "vllm.vllm_flash_attn",
            "vllm.entrypoints.openai.api_server", "xgrammar", "openai",
            "lmformatenforcer", "outlines_core"):
    try:
        m = __import__(mod, fromlist=["_"])
        rec.setdefault("imports", {})[mod] = "ok"
        if mod == "vllm.platforms":
            rec["platform"] = type(m.current_platform).__name__
    except BaseException as e:
        rec.setdefault("imports", {})[mod] = "".join(traceback.format_exception_only(e))[-800:]
try:
    from vllm._qwen3090 import __path__ as qp
    man = json.load(open(os.path.join(qp[0], "manifest.json")))
    rec["manifest"] = {"series_digest": man.get("series_digest"),
                       "patches": [p.get("name") for p in man.get("patches", [])]}
except Exception as e:
    rec["manifest_error"] = repr(e)
json.dump(rec, open(sys.argv[1], "w"), indent=2, default=str)
print(json.dumps(rec, indent=2, default=str))
EOF
cp "$BASE" "$OUT/result.json"

# 3. the demo model (qwen3_5, as `qwen3090 demo-model --arch qwen3_5` writes it) and its head
MODEL=$WORK/model
if [ -f "$BUNDLE/model/config.json" ]; then
  rm -rf "$MODEL" && cp -r "$BUNDLE/model" "$MODEL"
else
  "$PY" -m qwen3090 demo-model "$MODEL" --arch qwen3_5 || exit 3
fi
if [ "$SHAPE" = 27b ]; then
  t1=$(date +%s)
  "$PY" "$BUNDLE/shape27b.py" "$MODEL" --layers "${LAYERS:-8}" || exit 3
  note "27B shape took $(( $(date +%s) - t1 )) s"
fi
[ "$SPEC" = mtp ] && { "$PY" "$BUNDLE/mtp_head.py" "$MODEL" || exit 3; }
DRAFT_ARGS=()
# The KVarN life's repeat check compares greedy texts: the looping head keeps them off ties.
if [ "$LIFE_KV" = kvarn ]; then "$PY" "$BUNDLE/cycle_head.py" "$MODEL" || exit 3; fi
if [ "$SPEC" = dflash2 ]; then
  DRAFTER=$WORK/dflash2-drafter
  # A sharp, looping greedy text (cycle_head.py says why), then the drafter sharing its head.
  "$PY" "$BUNDLE/cycle_head.py" "$MODEL" || exit 3
  rm -rf "$DRAFTER" && "$PY" "$BUNDLE/dflash2_drafter.py" "$MODEL" "$DRAFTER" || exit 3
  DRAFT_ARGS=(--draft "$DRAFTER")
fi

if [ "${DRY:-0}" = 1 ]; then
  EXTRA="--attention-backend TRITON_ATTN --gdn-prefill-backend triton"
  if [ "$SPEC" = dflash2 ] && [ "$LIFE_CTX" = long ]; then
    # The knobs each life of exercise_server.py (LONG_LIVES) sets.
    for knobs in "LOOKUP=1 LOOKUP_ADAPTIVE=0" "LOOKUP=1 LOOKUP_ADAPTIVE=0 SPEC_ATTN=0" \
        "LOOKUP=1 LOOKUP_ADAPTIVE=0 GPUE2E_SPLIT=triton"; do
      note "plan for CTX=long $knobs"
      env $knobs CTX=long MODEL="$MODEL" SPEC=dflash2 DRAFT="$DRAFTER" DFLASH_TOKENS=15 \
        ASYNC_SCHED=0 PREFIX_CACHE=1 EXTRA_ARGS="--gdn-prefill-backend triton" \
        "$PY" -m qwen3090 plan || exit 4
    done
  elif [ "$SPEC" = dflash2 ]; then
    # The knobs each life of exercise_server.py (DFLASH2_LIVES) sets.
    for lookup in "LOOKUP=0" "LOOKUP=1 LOOKUP_ADAPTIVE=1" "LOOKUP=1 LOOKUP_ADAPTIVE=0"; do
      note "plan for $lookup"
      env $lookup MODEL="$MODEL" SPEC=dflash2 DRAFT="$DRAFTER" DFLASH_TOKENS=15 \
        ASYNC_SCHED=0 PREFIX_CACHE=1 EXTRA_ARGS="$EXTRA" "$PY" -m qwen3090 plan || exit 4
    done
  elif [ "$LIFE_KV" = kvarn ]; then
    # The knobs exercise_server.py's KVARN_KNOBS sets.
    if [ "$PROFILE" = batch ]; then knob="KV=kvarn"; else knob="CTX=huge"; fi
    env $knob MODEL="$MODEL" SPEC="$SPEC" PREFIX_CACHE=1 \
      EXTRA_ARGS="--gdn-prefill-backend triton" "$PY" -m qwen3090 plan --profile "$PROFILE"
  else
    MODEL="$MODEL" SPEC="$SPEC" PREFIX_CACHE=1 EXTRA_ARGS="$EXTRA" "$PY" -m qwen3090 plan
  fi
  exit 0
fi

# 4. serve, exercise, SIGINT; the record and the log come back
# (LIFE_, not KVARN_: `qwen3090 serve` refuses KVARN_* variables this build does not read.)
if [ "$LIFE_KV" = kvarn ] && [ "${LIFE_KV_PROBE:-1}" = 1 ]; then
  # The backend alone first: a failure here is cheaper to read than a server's.
  t1=$(date +%s)
  ( cd "$ROOT/python/tests/patch/probes" && \
    timeout 240 "$PY" kvarn_backend_probe.py "$OUT/kvarn_stream.pt" cuda \
      > "$OUT/kvarn_probe.json" 2> "$OUT/kvarn_probe.err" ) || note "kvarn probe: rc $?"
  note "kvarn probe took $(( $(date +%s) - t1 )) s"
fi
"$PY" "$BUNDLE/exercise_server.py" --model "$MODEL" --out "$OUT/result.json" \
  --log "$WORK/server.log" --spec "$SPEC" --kv "$LIFE_KV" --profile "$PROFILE" \
  --ctx "$LIFE_CTX" \
  --budget-s "$BUDGET_S" --base "$BASE" \
  --boot-timeout-s "${BOOT_TIMEOUT_S:-300}" ${RESUME:+--resume "$RESUME"} \
  ${DRAFT_ARGS[@]+"${DRAFT_ARGS[@]}"}
rc=$?
# Each attempt's log comes back whole when it is small, else its head and tail.
for f in "$WORK"/server.*.log; do
  [ -f "$f" ] || continue
  if [ "$(wc -c < "$f")" -lt 6000000 ]; then cp "$f" "$OUT/"; else
    { head -c 2000000 "$f"; echo; echo '[...]'; tail -c 2000000 "$f"; } > "$OUT/$(basename "$f")"
  fi
done
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv > "$OUT/nvidia-smi.csv" 2>&1
exit $rc
