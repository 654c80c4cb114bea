# The pinned Python closure of vLLM 0.28.0 (torch 2.13.0, its CUDA 13 wheels, Triton,
# FlashInfer, ...), every wheel of nix/closure/table.json except vLLM itself, installed side by
# side into ONE prefix: the NVIDIA wheels find each other through $ORIGIN-relative RUNPATHs
# (torch/lib -> ../../nvidia/*/lib), which only hold when they share a site-packages, exactly as
# in the pip environment upstream tests. vLLM is a separate derivation (nix/vllm.nix), so a
# change of the patch series never reinstalls these ~10 GB.
{
  lib,
  stdenv,
  fetchurl,
  python,
  autoPatchelfHook,
  autoAddDriverRunpath,
  patchelf,
  zlib,
  pins,
  # "runtime": the closure above; "test": only what checks.python-tests adds on top of it
  # (pytest, hypothesis and their pure-Python dependencies), put on PYTHONPATH beside it.
  part ? "runtime",
}:
let
  set = pins.closureFor python;
  entries = builtins.filter (e: e.name != "vllm") set.${part};
  wheels = map (
    e:
    fetchurl {
      inherit (e) url hash;
      name = e.file;
    }
  ) entries;
  # `installer` only runs at build time; it is not part of the closure.
  installer = python.pkgs.installer;
in
stdenv.mkDerivation {
  pname = "qwen3090-python-" + (if part == "runtime" then "closure" else part);
  version = pins.torchVersion;

  dontUnpack = true;
  dontConfigure = true;
  dontBuild = true;

  nativeBuildInputs = [
    autoPatchelfHook
    autoAddDriverRunpath
    patchelf
  ];
  # What the manylinux wheels expect from the host besides glibc.
  buildInputs = [
    stdenv.cc.cc.lib
    zlib
  ];

  autoPatchelfIgnoreMissingDeps = [
    # The userspace driver: it belongs to the running kernel module and comes from
    # /run/opengl-driver/lib at run time (autoAddDriverRunpath), never from the store.
    "libcuda.so.1"
    "libnvidia-ml.so.1"
  ];

  installPhase = ''
    runHook preInstall
    ${python.interpreter} -m venv --without-pip "$out"
    for whl in ${lib.escapeShellArgs wheels}; do
      PYTHONPATH=${installer}/${python.sitePackages} \
        "$out/bin/python" -m installer --no-compile-bytecode "$whl"
    done
    # Hash-checked pycs: a store path's mtime says nothing (gotcha 22).
    "$out/bin/python" -m compileall -q -j "$NIX_BUILD_CORES" \
      --invalidation-mode checked-hash "$out/${python.sitePackages}" || true
    runHook postInstall
  '';

  # autoPatchelf rewrites RUNPATHs to the directories of the NEEDED libraries it found, which
  # drops the wheels' own $ORIGIN entries; cuDNN, NVRTC and NCCL dlopen siblings by soname
  # through those, so remember them here and add them back after it ran.
  preFixup = ''
    while IFS= read -r -d "" elf; do
      rpath=$(patchelf --print-rpath "$elf" 2>/dev/null || true)
      case "$rpath" in
        *'$ORIGIN'*) printf '%s\t%s\n' "$elf" "$rpath" >> "$NIX_BUILD_TOP/origin-rpaths" ;;
      esac
    done < <(find "$out" -type f -name '*.so*' -print0)
  '';
  postPhases = [ "restoreOriginRunpathPhase" ];
  restoreOriginRunpathPhase = ''
    if [ -f "$NIX_BUILD_TOP/origin-rpaths" ]; then
      while IFS=$'\t' read -r elf rpath; do
        patchelf --add-rpath "$rpath" "$elf"
      done < "$NIX_BUILD_TOP/origin-rpaths"
    fi
  '';

  # Stripping the CUDA wheels breaks their ELF alignment (nixpkgs' torch-bin says the same).
  dontStrip = true;

  passthru = {
    inherit python;
    wheelCount = builtins.length entries;
  };

  meta = {
    description = "Pinned Python closure of vLLM ${pins.vllmVersion} with torch ${pins.torchVersion} (CUDA)";
    # torch and the NVIDIA wheels ship CUDA under NVIDIA's redistributable licence.
    license = with lib.licenses; [
      asl20
      bsd3
      unfreeRedistributable
    ];
    sourceProvenance = with lib.sourceTypes; [ binaryNativeCode ];
    platforms = [ "x86_64-linux" ];
  };
}
