# Everything the flake builds, for one nixpkgs instance. `python` picks the interpreter; its
# minor version must be one nix/closure/table.json holds (3.11 to 3.14).
{
  pkgs,
  lib ? pkgs.lib,
  python ? pkgs.python3,
  # The repository source, filtered to what the builds read.
  src,
  # patches/ and python/qwen3090/patchtool.py only: what the patched vLLM depends on.
  seriesSrc ? src,
}:
let
  pins = import ./pins.nix { inherit lib; };
  closure = pkgs.callPackage ./python-closure.nix { inherit python pins; };
  testTools = closure.override { part = "test"; };
  vllm = pkgs.callPackage ./vllm.nix {
    inherit python pins closure;
    inherit seriesSrc;
  };
  qwen3090 = pkgs.callPackage ./qwen3090.nix { inherit closure vllm src; };
in
{
  inherit
    pins
    closure
    testTools
    vllm
    qwen3090
    ;
  # import, not callPackage: callPackage would add `override` to the set of apps.
  apps = import ./apps.nix {
    inherit lib qwen3090;
    inherit (pkgs) writeShellApplication;
  };
}
