# The `qwen3090` command (and `vllm`, `qwen3090-python`) running on the pinned closure with the
# patched vLLM. Every decision lives in the Python package; the wrappers only put the right
# interpreter, paths, compilers and driver libraries under it. nix/build/wrapper.py writes
# them (and the nix-replay tier runs it with local paths and checks the environment).
{
  lib,
  stdenv,
  runtimeShell,
  coreutils,
  which,
  closure,
  vllm,
  # A source tree holding python/qwen3090.
  src,
  buildScripts ? ./build,
}:
let
  inherit (closure) python;
in
stdenv.mkDerivation (finalAttrs: {
  pname = "qwen3090";
  version = "0.1.0";
  inherit src;

  dontConfigure = true;
  dontBuild = true;

  # Run time, not build time: Triton compiles its CUDA launcher with $CC on first use (the
  # reason nixpkgs' own triton and vllm point at stdenv.cc); FlashInfer JIT-builds its kernels
  # with the closure's nvcc (nvidia-cuda-nvcc, CUDA_HOME), c++ and ninja, and looks for nvcc
  # with `which`. nvcc runs the host compiler, which runs `as` and `ld` from the bintools.
  installPhase = ''
    runHook preInstall
    ${closure}/bin/python ${buildScripts}/wrapper.py install --out "$out" --src . \
      --python ${closure}/bin/python --site-rel ${python.sitePackages} \
      --vllm-site ${vllm}/${python.sitePackages} --manifest ${vllm.manifest} \
      --shell ${runtimeShell} --coreutils ${coreutils}/bin \
      --cc ${stdenv.cc}/bin/cc --cxx ${stdenv.cc}/bin/c++ \
      --cuda-home ${closure}/${python.sitePackages}/nvidia/cu13 \
      --tool-path ${stdenv.cc}/bin --tool-path ${stdenv.cc.bintools}/bin \
      --tool-path ${which}/bin
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
