# vLLM 0.28.0 from the pinned CUDA wheel, with the qwen3090 patch series applied at build time
# by the same stdlib tool CI runs on the PyPI artifacts (python/qwen3090/patchtool.py), then
# byte-compiled with checked-hash pycs and stamped with vllm/_qwen3090/manifest.json.
#
# A wheel has no source tree for `patches = [ ... ]`, so the series is applied to the unpacked
# wheel, in its final location under $out: the pycs then name the real source paths, and the
# tree carries its manifest for `qwen3090 verify` and the cache key.
{
  lib,
  stdenv,
  fetchurl,
  python,
  gnupatch,
  autoPatchelfHook,
  autoAddDriverRunpath,
  pins,
  # python-closure.nix: torch and the CUDA libraries the extension modules link against.
  closure,
  # A source tree holding python/qwen3090/patchtool.py and patches/.
  seriesSrc,
  # nix/build: patched_vllm.py (the install step) and decisions.json, shared with the replay tier.
  buildScripts ? ./build,
}:
let
  wheel = pins.vllmWheel;
  site = "${placeholder "out"}/${python.sitePackages}";
  closureSite = "${closure}/${python.sitePackages}";
  own = (lib.importJSON (buildScripts + "/decisions.json")).vllm;
  entriesOf = set: builtins.removeAttrs set [ "_comment" ];
in
stdenv.mkDerivation (finalAttrs: {
  pname = "vllm-qwen3090";
  version = pins.vllmVersion;

  src = fetchurl {
    inherit (wheel) url sha256;
    name = wheel.filename;
  };
  dontUnpack = true;
  dontConfigure = true;
  dontBuild = true;

  nativeBuildInputs = [
    python
    gnupatch
    autoPatchelfHook
    autoAddDriverRunpath
  ];
  # GCC's runtime, the one provider decisions.json names for vLLM.
  buildInputs = lib.unique (
    lib.mapAttrsToList (
      soname: p:
      if p.by == "stdenv.cc.cc.lib" then
        stdenv.cc.cc.lib
      else
        throw "qwen3090: nix/build/decisions.json: no provider ${p.by} for ${soname} in nix/vllm.nix"
    ) (entriesOf own.provided)
  );

  # The extension modules name libtorch*, libc10*, libcudart.so.13 and libnvrtc.so.13 without
  # any RUNPATH (upstream relies on torch being imported first); point them at the closure's
  # directories decisions.json lists (the replay resolves against the same ones).
  preFixup = lib.concatMapStrings (
    dir: "addAutoPatchelfSearchPath ${closureSite}/${dir}\n"
  ) own.searchPaths;
  autoPatchelfIgnoreMissingDeps = builtins.attrNames (entriesOf own.ignored);

  # Unpack, apply the series with python/qwen3090/patchtool.py, drop the stale RECORD: the
  # script the nix-replay tier runs on the same wheel.
  installPhase = ''
    runHook preInstall
    ${python.interpreter} ${buildScripts}/patched_vllm.py install --wheel "$src" --site ${site} \
      --series-src ${seriesSrc} --jobs "$NIX_BUILD_CORES"
    runHook postInstall
  '';

  dontStrip = true;

  passthru = {
    inherit python closure;
    sitePackages = "${finalAttrs.finalPackage}/${python.sitePackages}";
    manifest = "${finalAttrs.finalPackage}/${python.sitePackages}/vllm/_qwen3090/manifest.json";
  };

  meta = {
    description = "vLLM ${pins.vllmVersion} (CUDA wheel) with the qwen3090 patch series";
    homepage = "https://github.com/vllm-project/vllm";
    license = lib.licenses.asl20;
    sourceProvenance = with lib.sourceTypes; [
      binaryNativeCode
      fromSource
    ];
    platforms = [ "x86_64-linux" ];
  };
})
