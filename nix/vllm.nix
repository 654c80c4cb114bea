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
}:
let
  wheel = pins.vllmWheel;
  site = "${placeholder "out"}/${python.sitePackages}";
  closureSite = "${closure}/${python.sitePackages}";
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
  buildInputs = [ stdenv.cc.cc.lib ];

  # The extension modules name libtorch*, libc10*, libcudart.so.13 and libnvrtc.so.13 without
  # any RUNPATH (upstream relies on torch being imported first); point them at the closure.
  preFixup = ''
    addAutoPatchelfSearchPath ${closureSite}/torch/lib
    for d in ${closureSite}/nvidia/*/lib ${closureSite}/nvidia/cu13/lib; do
      [ -d "$d" ] && addAutoPatchelfSearchPath "$d"
    done
  '';
  autoPatchelfIgnoreMissingDeps = [
    # The userspace driver, from /run/opengl-driver/lib at run time (autoAddDriverRunpath).
    "libcuda.so.1"
  ];

  installPhase = ''
    runHook preInstall
    mkdir -p ${site}
    ${python.interpreter} -m zipfile -e "$src" ${site}
    ${python.interpreter} ${seriesSrc}/python/qwen3090/patchtool.py apply \
      --root ${site} --patches ${seriesSrc}/patches --jobs "$NIX_BUILD_CORES"
    # The wheel's RECORD lists the unpatched hashes; nothing may "verify" against it.
    rm -f ${site}/vllm-${pins.vllmVersion}.dist-info/RECORD
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
