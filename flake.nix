{
  description = "Qwen3.8-27B on one RTX 3090 with vLLM 0.28.0 and a verified patch series";

  # One input. flake.lock pins nixos-unstable at d407951447dcd00442e97087bf374aad70c04cea
  # (2026-07-05) with narHash sha256-8i/87eeoqiGE4yOTjwSA3Eh/ziJRQEmd/unYU+K27sk=. Nix could not
  # fetch nixpkgs where this was written, so the pair is not computed here; it was chosen because
  # three independent public locks of nixos-unstable record exactly this rev and narHash:
  # hyprwm/Hyprland at c44cf81f027f7cbdd60ac098c3caa76cf8915fac, nix-community/lanzaboote at
  # 5fb6093d385da954beee1708c4c4f9d76bb45c38 and nix-community/stylix at
  # 66714e5ce44269ecc58c20d9196da8dbe1b27a31 (each a flake.lock written by its own
  # `nix flake update`). python/tests/nix/test_flake_lock.py holds the lock to this comment.
  # `nix flake update` replaces both.
  inputs.nixpkgs.url = "github:NixOS/nixpkgs/nixos-unstable";

  outputs =
    { self, nixpkgs }:
    let
      inherit (nixpkgs) lib;
      # vLLM's CUDA wheel exists for x86_64 Linux only; the deployment is one RTX 3090.
      system = "x86_64-linux";

      # A nixpkgs of our own: the CUDA wheels are unfree-redistributable, and Ampere (sm_86)
      # is the only architecture anything here would ever be built for.
      pkgs = import nixpkgs {
        inherit system;
        config = {
          allowUnfree = true;
          cudaSupport = true;
          cudaCapabilities = [ "8.6" ];
        };
      };

      # Only what the builds read, so editing docs or tests of other tiers rebuilds nothing.
      src = lib.fileset.toSource {
        root = ./.;
        fileset = lib.fileset.unions [
          ./patches
          ./python/pyproject.toml
          ./python/qwen3090
          ./python/tests
        ];
      };

      # The patched vLLM reads only the series and the tool that applies it, so a change
      # elsewhere in the Python package never rebuilds it.
      seriesSrc = lib.fileset.toSource {
        root = ./.;
        fileset = lib.fileset.unions [
          ./patches
          ./python/qwen3090/patchtool.py
        ];
      };

      builtFor =
        p:
        import ./nix {
          pkgs = p;
          inherit src seriesSrc;
        };
      built = builtFor pkgs;
    in
    {
      packages.${system} = {
        inherit (built) vllm qwen3090;
        python-closure = built.closure;
        default = built.qwen3090;
      };

      apps.${system} = built.apps // {
        default = built.apps.single-user;
      };

      overlays.default = final: _prev: {
        qwen3090 = (builtFor final).qwen3090;
        vllm-qwen3090 = (builtFor final).vllm;
      };

      nixosModules = {
        qwen3090 =
          { pkgs, ... }:
          {
            imports = [ ./modules/qwen3090 ];
            # The flake's build by default, so the module works without the overlay.
            services.qwen3090.package =
              lib.mkDefault
                self.packages.${pkgs.stdenv.hostPlatform.system}.qwen3090 or (builtFor pkgs).qwen3090;
          };
        default = self.nixosModules.qwen3090;
      };

      checks.${system} = import ./checks {
        inherit pkgs lib built src;
        inherit (lib) nixosSystem;
        nixosModule = self.nixosModules.qwen3090;
      };

      devShells.${system}.default = pkgs.mkShell {
        packages = [
          built.qwen3090
          pkgs.nixfmt
          pkgs.prometheus
          pkgs.uv
        ];
        shellHook = ''
          echo "qwen3090 $(qwen3090 --version 2>/dev/null | cut -d' ' -f2): qwen3090 plan, qwen3090 serve, nix flake check"
        '';
      };

      formatter.${system} = pkgs.nixfmt;
    };
}
