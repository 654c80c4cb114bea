# A stand-in for nixpkgs, just rich enough to evaluate nix/default.nix and checks/default.nix
# with nothing but nixpkgs' lib: every builder returns a fake derivation that keeps the
# attributes it was given, so the tests can read what the real build would run.
{ lib, pythonVersion ? "3.13" }:
let
  fake =
    name: extra:
    {
      type = "derivation";
      inherit name;
      outPath = "/nix/store/${builtins.substring 0 32 (builtins.hashString "sha256" name)}-${name}";
      meta.mainProgram = name;
    }
    // extra;
  python = fake "python3" {
    inherit pythonVersion;
    sitePackages = "lib/python${pythonVersion}/site-packages";
    interpreter = "/nix/store/python/bin/python3";
    pkgs.installer = fake "installer" { };
  };
  mkDerivation =
    arg:
    let
      attrs = if builtins.isFunction arg then arg { finalPackage = drv; } else arg;
      drv = fake "${attrs.pname}-${attrs.version}" (
        (attrs.passthru or { })
        // {
          inherit (attrs) version;
          meta = attrs.meta or { };
          drvAttrs = builtins.removeAttrs attrs [ "passthru" ];
        }
      );
    in
    drv;
in
lib.makeScope lib.callPackageWith (_: {
  inherit lib python;
  python3 = python;
  stdenv = {
    inherit mkDerivation;
    cc = fake "gcc-wrapper" {
      cc.lib = fake "gcc-lib" { };
      bintools = fake "binutils-wrapper" { };
    };
    hostPlatform.system = "x86_64-linux";
  };
  runtimeShell = "/nix/store/bash/bin/bash";
  coreutils = fake "coreutils" { };
  which = fake "which" { };
  stdenvNoCC = { inherit mkDerivation; };
  fetchurl =
    args:
    assert args ? url && (args ? hash || args ? sha256) && args ? name;
    fake args.name { inherit args; };
  autoPatchelfHook = fake "auto-patchelf-hook" { };
  autoAddDriverRunpath = fake "auto-add-driver-runpath" { };
  patchelf = fake "patchelf" { };
  zlib = fake "zlib" { };
  gnupatch = fake "gnupatch" { };
  makeWrapper = fake "make-wrapper" { };
  curl = fake "curl" { };
  writeShellApplication = args: fake args.name { drvAttrs = args; };
  runCommand =
    name: env: text:
    fake name {
      drvAttrs = env // {
        buildCommand = text;
      };
    };
})
