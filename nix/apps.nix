# `nix run .#single-user` / `.#batch`: `qwen3090 serve` with a profile; further arguments
# (knob flags, --config FILE) pass through, and knobs in the environment apply as usual.
{
  lib,
  writeShellApplication,
  qwen3090,
}:
let
  mkServe =
    profile:
    writeShellApplication {
      name = "qwen3090-${profile}";
      runtimeInputs = [ qwen3090 ];
      text = ''
        exec qwen3090 serve --profile ${lib.escapeShellArg profile} "$@"
      '';
      meta.description = "Serve Qwen3.8-27B with the ${profile} profile";
    };
  mkApp = profile: drv: {
    type = "app";
    program = lib.getExe drv;
    meta.description = "Serve Qwen3.8-27B on one RTX 3090 (${profile} profile)";
  };
in
{
  single-user = mkApp "single-user" (mkServe "single-user");
  batch = mkApp "batch" (mkServe "batch");
}
