# GPU checks: the flake's legacyPackages.x86_64-linux.gpuChecks, not `checks` (a builder
# without a GPU would fail `nix flake check` on them). Build them by name on a builder with an
# NVIDIA GPU that advertises the `cuda` system feature (NixOS:
# programs.nix-required-mounts.presets.nvidia-gpu.enable = true and
# nix.settings.system-features = [ "cuda" ... ]):
#   nix build .#gpuChecks.gpu-gate .#gpuChecks.gpu-serve-demo
# Inside the build the cc-wrapper drops -L/run/opengl-driver/lib (NIX_ENFORCE_PURITY); the
# qwen3090 wrapper links the driver's libraries into $TMPDIR, the build directory, which it
# keeps, so Triton links libcuda there.
{
  runCommand,
  curl,
  qwen3090,
}:
let
  gpuCheck =
    name: script:
    runCommand "qwen3090-gpu-${name}" {
      nativeBuildInputs = [
        qwen3090
        curl
      ];
      requiredSystemFeatures = [ "cuda" ];
    } script;
in
{
  # The gate against the real card: NVML answers and the idle card is found free.
  gpu-gate = gpuCheck "gate" ''
    qwen3090 gate --timeout 120 | tee $out
  '';

  # The demo model boots on the CUDA build of the patched vLLM, answers a completion, and
  # drains on SIGINT.
  gpu-serve-demo = gpuCheck "serve-demo" ''
    export HOME=$TMPDIR QWEN3090_CACHE_DIR=$TMPDIR/cache
    qwen3090-python - <<'PY'
    from pathlib import Path
    from qwen3090.demo_model import write_demo_model
    write_demo_model(Path("demo"))
    PY
    port=18090
    MODEL=$PWD/demo PORT=$port qwen3090 serve > serve.log 2>&1 &
    server=$!
    for _ in $(seq 600); do
      if curl -sf http://127.0.0.1:$port/health > /dev/null; then break; fi
      if ! kill -0 $server 2> /dev/null; then cat serve.log; exit 1; fi
      sleep 1
    done
    curl -sf http://127.0.0.1:$port/v1/completions -H 'content-type: application/json' \
      -d '{"model": "qwen3.8-27b", "prompt": "hello", "max_tokens": 8}' > completion.json
    kill -INT $server
    wait $server
    qwen3090-python -c 'import json; assert json.load(open("completion.json"))["choices"]'
    cp completion.json $out
  '';
}
