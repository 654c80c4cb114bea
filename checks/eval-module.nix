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
  # A real (never built) derivation, so strings naming the package carry its string context
  # as they do in NixOS: what checks/module-eval.nix must discard is there to be discarded.
  fakePackage =
    pname:
    derivation {
      name = pname;
      system = "x86_64-linux";
      builder = "/bin/sh";
    }
    // {
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
    coreutils = fakePackage "coreutils";
    writeShellScript = name: text: {
      type = "derivation";
      inherit name text;
      outPath = fakeStorePath name text;
    };
    # Keeps its text, so the tests can read a file the module renders (e.g. vLLM's logging
    # config) from the option that names it.
    writeText = name: text: {
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
      systemd.units = loose;
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

  # systemd.units.<name>.text of each service, as NixOS writes a unit file: one `Key=value`
  # line per value, a list repeated key by key. Only [Service] is rendered; it is what the
  # checks read.
  unitValue = v: if builtins.isBool v then lib.boolToString v else toString v;
  unitLines =
    attrs:
    lib.concatStrings (
      lib.mapAttrsToList (
        key: value: lib.concatMapStrings (v: "${key}=${unitValue v}\n") (lib.toList value)
      ) attrs
    );
  unitFiles =
    { config, ... }:
    {
      systemd.units = lib.mapAttrs' (
        name: unit:
        lib.nameValuePair "${name}.service" { text = "[Service]\n" + unitLines unit.serviceConfig; }
      ) config.systemd.services;
    };

  evalWith =
    modules:
    lib.evalModules {
      modules = [
        foreignOptions
        unitFiles
        {
          _module.args = { inherit pkgs utils; };
        }
      ]
      ++ modules;
    };
  evaluated = evalWith [
    ../modules/qwen3090
    configuration
  ];
  inherit (evaluated) config;
  units = config.systemd.services;
in
{
  inherit evaluated config;

  # nixpkgs' lib.nixosSystem as far as checks/module-eval.nix uses it, for testing that check
  # without nixpkgs.
  nixosSystem =
    { modules, ... }:
    {
      inherit (evalWith modules) config;
    };

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
