# The module evaluated inside a real NixOS system of the pinned nixpkgs: the unit it renders
# must pass checks/module-assertions.nix, and the rendered unit file must carry the lines whose
# systemd syntax matters. Evaluation failures fail `nix flake check`.
#
# Evaluation only: the unit text names the package's store paths, so it carries their string
# context, and any derivation built from it (the old `grep` over the unit file) depends on the
# whole closure. The text is checked here, in Nix, and written out with its context discarded,
# so the check's one output is a text file built from nothing but stdenv's writeText.
{
  lib,
  writeText,
  nixosSystem,
  nixosModule,
  system,
}:
let
  apiKeyFile = "/run/keys/qwen3090-api-key";
  machine = nixosSystem {
    inherit system;
    modules = [
      nixosModule
      {
        boot.isContainer = true;
        system.stateVersion = "26.05";
        services.qwen3090 = {
          enable = true;
          inherit apiKeyFile;
          settings = {
            SPEC = "mtp";
            PREFIX_CACHE = 1;
          };
        };
      }
    ];
  };
  inherit (machine) config;
  unitText = builtins.unsafeDiscardStringContext config.systemd.units."qwen3090.service".text;
  unitLines = lib.splitString "\n" unitText;
  hasLine = line: builtins.elem line unitLines;
  failedAssertions = map (a: a.message) (builtins.filter (a: !a.assertion) config.assertions);
  failures =
    failedAssertions
    ++ import ./module-assertions.nix {
      inherit lib apiKeyFile;
      units = config.systemd.services;
      inherit (config.networking) firewall;
    }
    ++ map (line: "qwen3090.service lacks the line ${line}") (
      builtins.filter (line: !hasLine line) [
        "KillSignal=SIGINT"
        "KillMode=mixed"
        "LoadCredential=api-key:${apiKeyFile}"
      ]
    );
in
if failures != [ ] then
  throw "services.qwen3090 evaluation failed:\n- ${lib.concatStringsSep "\n- " failures}"
else
  writeText "qwen3090-module-eval.service" unitText
