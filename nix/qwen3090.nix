# The `qwen3090` command (and `vllm`) running on the pinned closure with the patched vLLM.
# Every decision lives in the Python package; this only puts the right interpreter, paths and
# driver directory under it.
{
  lib,
  stdenvNoCC,
  makeWrapper,
  closure,
  vllm,
  # A source tree holding python/qwen3090.
  src,
}:
let
  inherit (closure) python;
  driverLib = "/run/opengl-driver/lib";
in
stdenvNoCC.mkDerivation (finalAttrs: {
  pname = "qwen3090";
  version = "0.1.0";
  inherit src;

  nativeBuildInputs = [ makeWrapper ];
  dontConfigure = true;
  dontBuild = true;

  installPhase = ''
    runHook preInstall
    site=$out/${python.sitePackages}
    mkdir -p "$site"
    cp -r python/qwen3090 "$site/"
    find "$site" -name __pycache__ -prune -exec rm -rf {} +
    ${closure}/bin/python -m compileall -q --invalidation-mode checked-hash "$site/qwen3090"

    # PYTHONPATH (not a site hook) so that vLLM's own subprocesses - the model-registry probe,
    # the engine core, API servers - inherit the same path: the reason nixpkgs' vllm carries
    # its propagate-pythonpath patch.
    wrapperArgs=(
      --prefix PYTHONPATH : "$site:${vllm}/${python.sitePackages}"
      --set QWEN3090_MANIFEST ${vllm.manifest}
      # NVML and the CUDA driver are dlopen'ed by name (pynvml, Triton, cuda-bindings); on
      # NixOS they live here, outside every RUNPATH of the interpreter.
      --suffix LD_LIBRARY_PATH : ${driverLib}
      --set-default TRITON_LIBCUDA_PATH ${driverLib}
    )
    makeWrapper ${closure}/bin/python "$out/bin/qwen3090" --add-flags "-m qwen3090" "''${wrapperArgs[@]}"
    makeWrapper ${closure}/bin/python "$out/bin/vllm" --add-flags "-m vllm.entrypoints.cli.main" "''${wrapperArgs[@]}"
    makeWrapper ${closure}/bin/python "$out/bin/qwen3090-python" "''${wrapperArgs[@]}"
    runHook postInstall
  '';

  passthru = {
    inherit closure vllm python;
  };

  meta = {
    description = "Qwen3.8-27B on one RTX 3090 with vLLM ${vllm.version} and a verified patch series";
    mainProgram = "qwen3090";
    license = lib.licenses.asl20;
    platforms = [ "x86_64-linux" ];
  };
})
