# What the rendered qwen3090 units must look like, as a list of failure messages ([] = pass).
# Shared by checks/module-eval.nix (a real NixOS evaluation) and the test suite (the
# lib-only evaluation of checks/eval-module.nix), so both hold the module to the same rules.
{
  lib,
  # config.systemd.services of an evaluation with services.qwen3090.enable = true and
  # apiKeyFile = apiKeyFile.
  units,
  # config.networking.firewall of that evaluation (openFirewall left at false).
  firewall,
  apiKeyFile,
}:
let
  unit = units.qwen3090;
  sc = unit.serviceConfig;
  pre = sc.ExecStartPre;
  # The program of an escaped Exec line, and its first argument.
  words = line: lib.splitString " " line;
  subcommand = line: builtins.elemAt (words line) 1;
  check = ok: message: if ok then [ ] else [ message ];
in
check (
  builtins.any (line: subcommand line == ''"check"'') pre
) "ExecStartPre should check the model and tokenizer before vLLM starts"
++ check (
  !(builtins.any (line: subcommand line == ''"gate"'') pre)
) "ExecStartPre must not gate the GPU: serve owns the GPU gate (gotcha 2)"
++ check (
  unit.environment ? VLLM_LOGGING_CONFIG_PATH && sc.LogsDirectory == "qwen3090"
) "vLLM must log to the journal and to /var/log/qwen3090/server.log (the exporter's boot log)"
++ check (lib.hasInfix ''"serve" "--config"'' sc.ExecStart) "ExecStart must be `qwen3090 serve --config FILE`"
++ check (
  lib.hasInfix ''"--gate-timeout"'' sc.ExecStart
) "serve must gate the GPU (before vLLM profiles memory; gotcha 2) with the module's gpuGate.timeout"
++ check (sc.KillSignal == "SIGINT") "vLLM drains on SIGINT; KillSignal must be SIGINT"
++ check (
  (sc.KillMode or null) == "mixed"
) "KillMode must be mixed: the SIGINT goes to vLLM's main process alone, which stops its children"
++ check (sc.DynamicUser) "the server runs as a DynamicUser"
++ check (!sc.PrivateDevices) "PrivateDevices would hide the GPU"
++ check (sc.DevicePolicy == "closed") "DevicePolicy must stay closed"
++ check (builtins.all (d: builtins.elem d sc.DeviceAllow) [
  "char-nvidiactl"
  "char-nvidia-frontend"
  "char-nvidia-uvm"
]) "DeviceAllow must include nvidiactl, nvidia-frontend and nvidia-uvm"
++ check (sc.LimitMEMLOCK == "infinity") "CUDA pinned memory needs LimitMEMLOCK=infinity"
++ check (!sc.MemoryDenyWriteExecute) "the JITs need MemoryDenyWriteExecute=false"
++ check (sc.CacheDirectory == "qwen3090") "the caches live in CacheDirectory=qwen3090"
++ check (
  unit.environment.QWEN3090_CACHE_DIR == "/var/cache/qwen3090"
) "QWEN3090_CACHE_DIR must point at the CacheDirectory"
++ check (
  sc.LoadCredential == [ "api-key:${apiKeyFile}" ]
) "the API key file must reach the unit through LoadCredential"
++ check (
  !(lib.hasInfix apiKeyFile (builtins.toJSON unit.environment))
) "the API key path must not be in the environment"
++ check (firewall.allowedTCPPorts == [ ]) "openFirewall = false must open no port"
++ check (sc.Restart == "on-failure" && unit.startLimitBurst > 0) "restart on failure, with a start limit"
