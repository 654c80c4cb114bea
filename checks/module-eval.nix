# The module evaluated inside a real NixOS system of the pinned nixpkgs (no build): the unit
# it renders must pass checks/module-assertions.nix. Evaluation failures fail `nix flake check`.
{
  lib,
  runCommand,
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
  failedAssertions = map (a: a.message) (builtins.filter (a: !a.assertion) config.assertions);
  failures =
    failedAssertions
    ++ import ./module-assertions.nix {
      inherit lib apiKeyFile;
      units = config.systemd.services;
      inherit (config.networking) firewall;
    };
  unitFile = config.systemd.units."qwen3090.service".unit;
in
if failures != [ ] then
  throw "services.qwen3090 evaluation failed:\n- ${lib.concatStringsSep "\n- " failures}"
else
  # The unit file itself is built, so systemd's own syntax is what gets stored.
  runCommand "qwen3090-module-eval" { } ''
    grep -q '^KillSignal=SIGINT$' ${unitFile}/qwen3090.service
    grep -q '^LoadCredential=api-key:${apiKeyFile}$' ${unitFile}/qwen3090.service
    cp ${unitFile}/qwen3090.service $out
  ''
