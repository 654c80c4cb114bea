# Everything `nix flake check` runs on x86_64-linux: none of it needs a GPU. The GPU checks
# (checks/gpu.nix) are the flake's legacyPackages.x86_64-linux.gpuChecks, built by name on a
# builder with the `cuda` system feature.
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
