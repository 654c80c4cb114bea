# Everything `nix flake check` runs on x86_64-linux. The GPU checks carry
# requiredSystemFeatures = [ "cuda" ], so only a GPU builder picks them up.
{
  pkgs,
  lib,
  built, # nix/default.nix
  src,
  nixosSystem,
  nixosModule,
}:
{
  verifier = pkgs.callPackage ./verifier.nix { inherit (built) qwen3090 pins; };
  tokenizer = pkgs.callPackage ./tokenizer.nix { inherit (built) qwen3090; };
  module-eval = pkgs.callPackage ./module-eval.nix {
    inherit nixosSystem nixosModule;
    inherit (pkgs.stdenv.hostPlatform) system;
  };
  python-tests = pkgs.callPackage ./python-tests.nix {
    inherit (built) qwen3090 testTools;
    inherit src;
  };
}
# import, not callPackage: callPackage would add `override` to this set of checks.
// import ./gpu.nix {
  inherit (pkgs) runCommand curl;
  inherit (built) qwen3090;
}
