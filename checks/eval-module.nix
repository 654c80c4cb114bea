# Evaluate services.qwen3090 with nothing but nixpkgs' lib: the NixOS options the module
# sets are declared here, loosely typed, and `pkgs`/`utils` are small stand-ins. This is what
# the test suite runs on a machine without nixpkgs (NIXPKGS_LIB points at a nixpkgs.lib
# checkout); checks/module-eval.nix evaluates the same module inside a real NixOS system.
#
#   nix-instantiate --eval --strict --json --readonly-mode \
#     --arg lib 'import <nixpkgs.lib checkout>/lib' \
#     --arg configuration '{ services.qwen3090.enable = true; }' \
#     checks/eval-module.nix -A summary
{
  lib,
  configuration ? { },
}:
let
  inherit (lib) mkOption types;

  # Store-path look-alikes; nothing is built or written.
  fakeStorePath =
    name: seed: "/nix/store/${builtins.substring 0 32 (builtins.hashString "sha256" seed)}-${name}";
  fakePackage = pname: {
    type = "derivation";
    name = pname;
    outPath = fakeStorePath pname pname;
    meta.mainProgram = pname;
  };

  pkgs = {
    qwen3090 = fakePackage "qwen3090";
    curl = fakePackage "curl";
    formats.yaml =
      { }:
      {
        type = types.attrsOf types.anything;
        # The real generator renders YAML; JSON is the YAML subset, and keeping the value
        # lets the test write the very file `qwen3090 plan --config` will read.
        generate = name: value: {
          type = "derivation";
          inherit name value;
          outPath = fakeStorePath name (builtins.toJSON value);
        };
      };
    writeShellScript = name: text: {
      type = "derivation";
      inherit name text;
      outPath = fakeStorePath name text;
    };
  };

  # The quoting rule of nixpkgs' nixos/lib/utils.nix: a JSON string per argument, with
  # systemd's specifier (%) and variable ($) characters doubled.
  utils.escapeSystemdExecArgs = lib.concatMapStringsSep " " (
    arg:
    let
      s =
        if builtins.isString arg then
          arg
        else if builtins.isInt arg || builtins.isFloat arg || lib.isDerivation arg then
          toString arg
        else
          throw "escapeSystemdExecArg: ${builtins.typeOf arg} is not an argument";
    in
    builtins.replaceStrings [ "%" "$" ] [ "%%" "$$" ] (builtins.toJSON s)
  );

  loose = mkOption {
    type = types.attrsOf types.anything;
    default = { };
  };
  looseList = mkOption {
    type = types.listOf types.anything;
    default = [ ];
  };

  foreignOptions = {
    options = {
      assertions = looseList;
      warnings = mkOption {
        type = types.listOf types.str;
        default = [ ];
      };
      systemd.services = loose;
      users.users = loose;
      users.groups = loose;
      networking.firewall.allowedTCPPorts = mkOption {
        type = types.listOf types.port;
        default = [ ];
      };
      networking.firewall.allowedUDPPorts = mkOption {
        type = types.listOf types.port;
        default = [ ];
      };
      services.prometheus.scrapeConfigs = looseList;
      services.prometheus.ruleFiles = looseList;
      # Set by the README's NixOS example and the module-eval check around the module, not
      # by the module: accepted, never read.
      hardware = loose;
      services.xserver = loose;
      boot = loose;
      system = loose;
    };
  };

  evaluated = lib.evalModules {
    modules = [
      foreignOptions
      ../modules/qwen3090
      {
        _module.args = { inherit pkgs utils; };
      }
      configuration
    ];
  };
  inherit (evaluated) config;
  units = config.systemd.services;
in
{
  inherit evaluated config;

  # Everything the tests assert on, as plain JSON.
  summary = {
    failedAssertions = map (a: a.message) (builtins.filter (a: !a.assertion) config.assertions);
    inherit (config) warnings;
    units = lib.mapAttrs (_: unit: unit) units;
    firewall = config.networking.firewall;
    prometheus = {
      inherit (config.services.prometheus) scrapeConfigs;
      ruleFiles = map toString config.services.prometheus.ruleFiles;
    };
    configFile = {
      path = toString config.services.qwen3090.configFile;
      value = config.services.qwen3090.configFile.value or null;
    };
    storePaths = {
      package = toString config.services.qwen3090.package;
    };
  };
}
