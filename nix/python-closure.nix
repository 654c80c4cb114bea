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
  # nix/build: the install step (closure.py) and decisions.json (native dependencies,
  # collisions), shared with the nix-replay test tier.
  buildScripts ? ./build,
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
  decisions = lib.importJSON (buildScripts + "/decisions.json");
  own = decisions.closure;
  providers = {
    "stdenv.cc.cc.lib" = stdenv.cc.cc.lib;
    inherit zlib;
  };
  entriesOf = set: builtins.removeAttrs set [ "_comment" ];
  provider =
    name:
    providers.${name} or (throw "qwen3090: nix/build/decisions.json names an unknown provider ${name}");
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
  # What the manylinux wheels expect from the host besides glibc, and what stays missing on
  # purpose: both from nix/build/decisions.json, with the reason for each soname there.
  buildInputs = lib.unique (lib.mapAttrsToList (_: p: provider p.by) (entriesOf own.provided));
  autoPatchelfIgnoreMissingDeps = builtins.attrNames (entriesOf own.ignored);

  # The same script the nix-replay tier runs on the same wheels: it fails on any file two
  # wheels install unless decisions.json says which copies go.
  installPhase = ''
    runHook preInstall
    PYTHONPATH=${installer}/${python.sitePackages} ${python.interpreter} \
      ${buildScripts}/closure.py install --prefix "$out" \
      --decisions ${buildScripts}/decisions.json --jobs "$NIX_BUILD_CORES" \
      ${lib.escapeShellArgs wheels}
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
