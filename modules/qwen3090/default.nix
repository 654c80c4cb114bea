{
  config,
  lib,
  pkgs,
  utils,
  ...
}:
let
  inherit (lib) literalExpression mkOption types;

  cfg = config.services.qwen3090;
  settingsFormat = pkgs.formats.yaml { };

  qwen3090 = lib.getExe cfg.package;
  staticUser = cfg.user != null && cfg.group != null;
  # Both units run as the same (dynamic) user so the fetcher's files are the server's files:
  # systemd shares one dynamic UID between units that name the same User=.
  userName = if cfg.user != null then cfg.user else "qwen3090";
  groupName = if cfg.group != null then cfg.group else "qwen3090";

  stateDir = "/var/lib/qwen3090";
  # The exporter keeps its largest-pool reference apart from the server's files.
  exporterStateDir = "/var/lib/qwen3090-exporter";
  logsDir = "/var/log/qwen3090";
  serverLogFile = "${logsDir}/server.log";
  # Above this size server.log is moved aside before a start (one old copy is kept).
  serverLogMaxBytes = 16 * 1024 * 1024;

  # nixpkgs' types.port is ints.u16 and so takes 0, which no server can listen on.
  portType = types.ints.between 1 65535;
  # Directories the units create and write: absolute, and outside the read-only store.
  writableDir = types.pathWith {
    absolute = true;
    inStore = false;
  };

  # vLLM's logging, as VLLM_LOGGING_CONFIG_PATH hands it to logging.config.dictConfig in the
  # API server and in the engine core (vllm/logger.py of 0.28.0). Two handlers on the "vllm"
  # logger, because each reader needs its own: stdout stays the journal (journalctl -u
  # qwen3090, as without this file), and the file gives `qwen3090 exporter --server-log` the
  # boot lines (KV pool, compile cache), which it could not read from the journal without
  # privileges it should not have. vLLM's own formatter and format, so both read alike.
  logLevel = cfg.environment.VLLM_LOGGING_LEVEL or "INFO";
  loggingConfig = {
    version = 1;
    disable_existing_loggers = false;
    formatters.vllm = {
      class = "vllm.logging_utils.NewLineFormatter";
      datefmt = "%m-%d %H:%M:%S";
      format = "%(levelname)s %(asctime)s [%(fileinfo)s:%(lineno)d] %(message)s";
    };
    handlers = {
      journal = {
        class = "logging.StreamHandler";
        formatter = "vllm";
        stream = "ext://sys.stdout";
      };
      file = {
        class = "logging.FileHandler";
        formatter = "vllm";
        filename = serverLogFile;
        encoding = "utf-8";
      };
    };
    loggers.vllm = {
      handlers = [
        "journal"
        "file"
      ];
      level = logLevel;
      propagate = false;
    };
  };
  loggingConfigFile = pkgs.writeText "qwen3090-vllm-logging.json" (builtins.toJSON loggingConfig);

  # modules/qwen3090/rotate-log.sh with coreutils on PATH; see the script for why.
  rotateLog = pkgs.writeShellScript "qwen3090-rotate-log" ''
    PATH=${lib.makeBinPath [ pkgs.coreutils ]}
    ${builtins.readFile ./rotate-log.sh}
  '';
  rotateLogArgv = [
    # A string, as for serveArgv: older nixpkgs' escapeSystemdExecArg takes no derivations.
    "${rotateLog}"
    serverLogFile
    serverLogMaxBytes
  ];

  cacheUnderVarCache = lib.hasPrefix "/var/cache/" cfg.cacheDir;
  # A wildcard bind address is not something to connect to: scrape and probe loopback.
  reachableHost =
    if cfg.host == "0.0.0.0" then
      "127.0.0.1"
    else if cfg.host == "::" || cfg.host == "[::]" then
      "[::1]"
    else
      cfg.host;

  # The keys the module owns; the rest of the YAML is `settings`, the knobs of python/docs/PROFILES.md.
  ownedKeys = [
    "profile"
    "host"
    "port"
    "model"
  ];
  renderedSettings =
    lib.filterAttrs (_: v: v != null) cfg.settings
    // {
      inherit (cfg) profile host port;
      model = cfg.modelDir;
    }
    # The drafter where the fetch unit puts it: serve's own default is relative to the
    # working directory, which is not modelsDir once that is moved.
    // lib.optionalAttrs needsDrafter {
      DRAFT = "${cfg.modelsDir}/${pins.models.${builtins.head draftTargets}.dir}";
    };

  # The checkpoints `qwen3090 fetch` knows: the pins file of this checkout, which the package
  # built from it carries too. Only names, roles, directories and revisions are read here.
  pins = lib.importJSON ../../python/qwen3090/pins.json;
  namesWhere = pred: builtins.attrNames (lib.filterAttrs (_: pred) pins.models);
  defaultTargets = namesWhere (m: m.default or false);
  draftTargets = namesWhere (m: (m.role or "target") == "draft");
  # DFlash2 needs its drafter; a DRAFT the user set points elsewhere, so nothing is added.
  needsDrafter = cfg.settings.SPEC == "dflash2" && !(cfg.settings ? DRAFT) && draftTargets != [ ];
  # `qwen3090 fetch` exits with this status when a target has no revision (python/qwen3090/
  # fetch.py): no retry can fix that, so the unit stops at once instead of backing off forever.
  unpinnedExit = 4;
  unpinnedTargets = builtins.filter (
    t: (pins.models.${t}.revision or null) == null && !(cfg.fetchModel.revisions ? ${t})
  ) cfg.fetchModel.targets;

  # The checkpoint serve itself would pick (python/qwen3090/profiles.py MODEL_NAMES: the fast
  # variant when it is there, else the base one), "there" meaning fetched by the fetch unit.
  # Without that unit the base checkpoint, the one every layout has.
  servedPreference = [
    "fast"
    "base"
  ];
  fetchedTargets = lib.optionals cfg.fetchModel.enable cfg.fetchModel.targets;
  defaultModelTarget = lib.findFirst (t: builtins.elem t fetchedTargets) "base" servedPreference;

  checkModelArgv = [
    qwen3090
    "check"
    "model"
    cfg.modelDir
  ];
  # `qwen3090 serve` is the one owner of the GPU gate (gotcha 2): it waits for a free card
  # right before it execs vLLM, so the unit passes the gpuGate options to it instead of
  # running a gate of its own in ExecStartPre (two gates with two policies disagreed).
  gateFlags =
    if cfg.gpuGate.enable then
      lib.optionals (cfg.gpuGate.thresholdMiB != null) [
        "--gate-threshold-mib"
        cfg.gpuGate.thresholdMiB
      ]
      ++ [
        "--gate-timeout"
        cfg.gpuGate.timeout
      ]
    else
      [ "--no-gate" ];
  serveArgv = [
    qwen3090
    "serve"
    "--config"
    # A string: older nixpkgs' escapeSystemdExecArg takes no derivations.
    "${cfg.configFile}"
  ]
  ++ gateFlags;

  # Hardening shared by every unit here. Each relaxation from the strictest setting says why.
  hardening = {
    CapabilityBoundingSet = [ "" ];
    LockPersonality = true;
    NoNewPrivileges = true;
    PrivateTmp = true;
    PrivateUsers = true;
    ProtectClock = true;
    ProtectControlGroups = true;
    ProtectHome = true;
    ProtectHostname = true;
    ProtectKernelLogs = true;
    ProtectKernelModules = true;
    ProtectKernelTunables = true;
    ProtectProc = "invisible";
    ProcSubset = "pid";
    ProtectSystem = "strict";
    RemoveIPC = true;
    RestrictNamespaces = true;
    RestrictRealtime = true;
    RestrictSUIDSGID = true;
    RestrictAddressFamilies = [
      "AF_INET"
      "AF_INET6"
      "AF_UNIX"
    ];
    SystemCallArchitectures = "native";
    SystemCallFilter = [
      "@system-service @resources"
      "~@privileged"
    ];
    UMask = "0077";
  };

  gpuAccess = {
    # Relaxed: PrivateDevices would hide /dev/nvidia*; DevicePolicy below still closes the
    # rest of /dev.
    PrivateDevices = false;
    DevicePolicy = "closed";
    DeviceAllow = [
      "char-nvidiactl"
      "char-nvidia-caps"
      # /dev/nvidia0 and friends: without it an RTX 3090 is invisible (nixpkgs issue 331069).
      "char-nvidia-frontend"
      "char-nvidia-uvm"
    ];
    # Relaxed: torch.compile/inductor, Triton and the driver's PTX JIT map freshly written
    # code executable; vLLM cannot start under MemoryDenyWriteExecute.
    MemoryDenyWriteExecute = false;
    # Relaxed: CUDA pins host buffers (page-locked memory for H2D copies and the KV offload
    # paths); the default 8 MiB limit makes those allocations fail.
    LimitMEMLOCK = "infinity";
    # Relaxed: vLLM and torch read /proc/meminfo, /proc/cpuinfo and /proc/self/* beyond pids.
    ProcSubset = "all";
    # Relaxed: the GPU gate names the processes that hold the card (gotcha 2) from
    # /proc/<pid>; with "invisible" it could report bare pids only.
    ProtectProc = "default";
  };

  # Ready means /health answers 200, so units ordered after this one meet a serving model.
  waitReady = pkgs.writeShellScript "qwen3090-wait-ready" ''
    url=${lib.escapeShellArg "http://${reachableHost}:${toString cfg.port}/health"}
    while ! ${lib.getExe pkgs.curl} --silent --fail --max-time 5 --output /dev/null "$url"; do
      if ! kill -0 "$MAINPID" 2>/dev/null; then
        echo "qwen3090: the server exited before $url answered" >&2
        exit 1
      fi
      sleep 2
    done
  '';

in
{
  options.services.qwen3090 = {
    enable = lib.mkEnableOption "Qwen3.8-27B served by vLLM 0.28.0 on one RTX 3090";

    package = lib.mkPackageOption pkgs "qwen3090" { };

    user = mkOption {
      type = types.nullOr types.str;
      default = null;
      example = "qwen3090";
      description = ''
        User the server and the model fetcher run as. `null` means a
        [`DynamicUser`](https://www.freedesktop.org/software/systemd/man/latest/systemd.exec.html#DynamicUser=)
        named `qwen3090`. A non-null value creates a system user of that name.
      '';
    };

    group = mkOption {
      type = types.nullOr types.str;
      default = cfg.user;
      defaultText = literalExpression "config.services.qwen3090.user";
      example = "qwen3090";
      description = "Group of {option}`services.qwen3090.user`; only used when that is set.";
    };

    profile = mkOption {
      type = types.enum [
        "single-user"
        "batch"
      ];
      default = "single-user";
      description = ''
        Serving profile (PROFILES.md): `single-user` tunes for one conversation with
        speculative decoding (MTP or DFlash2), `batch` for up to 64 concurrent sequences.
      '';
    };

    settings = mkOption {
      type = types.submodule {
        freeformType = settingsFormat.type;
        options = {
          SPEC = mkOption {
            type = types.nullOr (
              types.enum [
                "mtp"
                "dflash2"
                "off"
              ]
            );
            default = null;
            description = "Speculative decoding in the single-user profile; `null` keeps the default (`mtp`).";
          };
          CTX = mkOption {
            type = types.nullOr (
              types.enum [
                "fast"
                "long"
                "huge"
              ]
            );
            default = null;
            description = "Context class of the single-user profile; `null` keeps the default (`fast`).";
          };
          KV = mkOption {
            type = types.nullOr (
              types.enum [
                "fp8"
                "int4pth"
                "kvarn"
              ]
            );
            default = null;
            description = "KV-cache layout of the batch profile; `null` keeps the default (`fp8`).";
          };
        };
      };
      default = { };
      example = literalExpression ''
        {
          SPEC = "dflash2";
          CTX = "long";
          DFLASH_TOKENS = 15;
          PREFIX_CACHE = 1;
        }
      '';
      description = ''
        The serving knobs of PROFILES.md (`SPEC`, `CTX`, `DFLASH_TOKENS`, `KV_MEM`,
        `PREFIX_CACHE`, `GPU_UTIL`, `EXTRA_ARGS`, ...), written to the YAML file that
        `qwen3090 serve --config` reads. Every knob is resolved and validated by that command,
        exactly as the same knob given in the environment or on its command line; an invalid
        combination stops the unit with the reason and the fix in the journal.
        `profile`, `host`, `port` and `model` come from the options of the same names.
      '';
    };

    configFile = mkOption {
      type = types.path;
      default = settingsFormat.generate "qwen3090.yaml" renderedSettings;
      defaultText = literalExpression "a YAML file generated from services.qwen3090.settings and the options above";
      description = ''
        The settings file passed to `qwen3090 serve --config`. Generated by default; set it
        to a file of your own to bypass {option}`services.qwen3090.settings`.
      '';
    };

    host = mkOption {
      type = types.str;
      default = "127.0.0.1";
      example = "0.0.0.0";
      description = ''
        Address the OpenAI-compatible server binds. Anything but loopback without
        {option}`services.qwen3090.apiKeyFile` serves the model to the network unauthenticated.
      '';
    };

    port = mkOption {
      type = portType;
      default = 18020;
      description = "TCP port of the OpenAI-compatible server.";
    };

    modelsDir = mkOption {
      type = writableDir;
      default = "${stateDir}/models";
      defaultText = literalExpression ''"/var/lib/qwen3090/models"'';
      description = ''
        Directory holding the checkpoint directories (`QWEN3090_MODELS_DIR`): where
        {option}`services.qwen3090.fetchModel` downloads to, where a relative
        {option}`services.qwen3090.modelDir` points, and where the DFlash2 drafter is looked
        for (`settings.SPEC = "dflash2"` without a `DRAFT` renders `DRAFT` as the pins file's
        drafter directory here). An absolute path outside the Nix store.
      '';
    };

    modelDir = mkOption {
      type = types.nonEmptyStr;
      default = pins.models.${defaultModelTarget}.dir;
      defaultText = lib.literalMD ''
        the directory of the pins file's `fast` checkpoint when
        {option}`services.qwen3090.fetchModel` fetches it (serve's own first choice), else of
        its `base` checkpoint
      '';
      example = "Qwen3.8-27B-W4A16-AutoRound";
      # One rule for relative paths: they name a directory under modelsDir, where the fetch
      # unit puts checkpoints. The unit's working directory is no base anyone would mean.
      apply = dir: if lib.hasPrefix "/" dir then dir else "${cfg.modelsDir}/${dir}";
      description = ''
        Directory of the served checkpoint (config.json, safetensors shards, tokenizer.json).
        A relative path is taken under {option}`services.qwen3090.modelsDir`; an absolute one
        as it is. Checked by `qwen3090 check model` before every start. Its path must not
        contain `dflash` (vLLM 0.28.0 picks the speculative method from the model path;
        gotcha 14).
      '';
    };

    apiKeyFile = mkOption {
      type = types.nullOr (
        types.pathWith {
          absolute = true;
          inStore = false;
        }
      );
      default = null;
      example = "/run/secrets/qwen3090-api-key";
      description = ''
        File holding the API key clients must send. Passed to the unit with systemd's
        `LoadCredential=`, so the key never enters the Nix store or the unit file; give a
        string path (a Nix path literal would be copied into the store and is refused).
      '';
    };

    environmentFile = mkOption {
      type = types.nullOr (
        types.pathWith {
          absolute = true;
          inStore = false;
        }
      );
      default = null;
      example = "/run/secrets/qwen3090.env";
      description = ''
        Environment file (systemd `EnvironmentFile=`) for the server, e.g. knobs you keep
        out of the store. Knobs set here win over the same knobs in the settings file
        (`qwen3090 serve`'s precedence: flag > environment > settings file > profile default).
      '';
    };

    environment = mkOption {
      type = types.attrsOf types.str;
      default = { };
      example = {
        CUDA_VISIBLE_DEVICES = "1";
      };
      description = ''
        Extra environment of the server, merged under the cache and home variables the
        module sets.
      '';
    };

    openFirewall = mkOption {
      type = types.bool;
      default = false;
      description = ''
        Whether to open {option}`services.qwen3090.port` in the firewall (and the exporter
        port when the exporter is enabled).
      '';
    };

    cacheDir = mkOption {
      type = writableDir;
      default = "/var/cache/qwen3090";
      description = ''
        Base of every persistent cache (`QWEN3090_CACHE_DIR`): the vLLM compile cache, keyed
        by the build's patch-series digest so a new series never replays an old artifact,
        and the Triton, inductor, FlashInfer and Hugging Face caches. Under `/var/cache` it
        is the unit's `CacheDirectory=`; elsewhere it must exist and be writable by the user.
        An absolute path outside the Nix store.
      '';
    };

    gpuGate = {
      enable = mkOption {
        type = types.bool;
        default = true;
        description = ''
          Wait until the GPU is free and stable before vLLM profiles its memory (gotcha 2).
          `qwen3090 serve` runs this gate right before it starts vLLM, with the two options
          below as its `--gate-threshold-mib` and `--gate-timeout`; `false` passes
          `--no-gate`.
        '';
      };
      thresholdMiB = mkOption {
        type = types.nullOr types.ints.unsigned;
        default = null;
        example = 4096;
        description = ''
          Used GPU memory below this many MiB counts as free. `null` keeps the default of
          `qwen3090 serve --gate-threshold-mib` (2048 MiB: room for a desktop on the card).
        '';
      };
      timeout = mkOption {
        type = types.ints.positive;
        default = 600;
        description = ''
          Seconds the gate waits for a free GPU before the start fails, naming who holds it
          (`qwen3090 serve --gate-timeout`).
        '';
      };
    };

    startTimeout = mkOption {
      type = types.ints.positive;
      default = 1800;
      description = ''
        Seconds a start may take after the gate: weight loading plus a cold torch.compile
        (~180 s on an RTX 3090; ~4 s once the compile cache is warm) plus CUDA-graph capture.
      '';
    };

    fetchModel = {
      enable = lib.mkEnableOption ''
        a oneshot unit (`qwen3090-fetch-model.service`) that downloads the pinned checkpoints
        into {option}`services.qwen3090.modelsDir` with huggingface_hub before the server
        starts, retrying network failures with a bounded exponential back-off; a target
        without a revision fails it once, with the reason
      '';
      targets = mkOption {
        type = types.listOf (types.enum (builtins.attrNames pins.models));
        default = defaultTargets ++ lib.optionals needsDrafter draftTargets;
        defaultText = lib.literalMD ''
          the pins file's default targets (`[ "base" "fast" ]`), plus its drafter
          (`"dflash2"`) when `settings.SPEC = "dflash2"` and `settings.DRAFT` is unset
        '';
        example = [
          "base"
          "dflash2"
        ];
        description = ''
          Names of the checkpoints to fetch, from the `models` section of the pins file
          (`qwen3090 fetch --list`: `base`, `fast`, `dflash2`). Each lands in its own
          directory under {option}`services.qwen3090.modelsDir`.
        '';
      };
      revisions = mkOption {
        type = types.attrsOf types.str;
        default = { };
        example = {
          base = "0123456789abcdef0123456789abcdef01234567";
        };
        description = ''
          Revision (commit) per target name, for targets the pins file pins none for, or to
          override it. A target with neither is refused by the fetch unit at once (exit
          status ${toString unpinnedExit}, no retry) unless its directory is already complete.
        '';
      };
      tokenFile = mkOption {
        type = types.nullOr (
          types.pathWith {
            absolute = true;
            inStore = false;
          }
        );
        default = null;
        description = "File holding a Hugging Face token (gated repositories); passed with `LoadCredential=`.";
      };
    };

    exporter = {
      enable = mkOption {
        type = types.bool;
        default = cfg.prometheus.scrape.enable;
        defaultText = literalExpression "config.services.qwen3090.prometheus.scrape.enable";
        description = ''
          Run `qwen3090 exporter` as its own unit: a small chat canary against the server
          (success, TTFT, decode rate), /health agreement, the build's vLLM version and
          patch-series digest, on a Prometheus `/metrics` endpoint.
        '';
      };
      port = mkOption {
        type = portType;
        default = 18021;
        description = "TCP port of the exporter's `/metrics`.";
      };
    };

    prometheus.scrape = {
      enable = lib.mkEnableOption ''
        scrape jobs in {option}`services.prometheus.scrapeConfigs` for vLLM's `/metrics` and
        the qwen3090 exporter, and the qwen3090 alerting and recording rules in
        {option}`services.prometheus.ruleFiles`
      '';
      interval = mkOption {
        type = types.str;
        default = "15s";
        description = "Scrape interval of both jobs.";
      };
    };
  };

  config = lib.mkIf cfg.enable {
    assertions = [
      {
        assertion = builtins.all (k: !(cfg.settings ? ${k})) ownedKeys;
        message = "services.qwen3090.settings must not set ${lib.concatStringsSep ", " ownedKeys}: use services.qwen3090.{profile,host,port,modelDir} instead.";
      }
      {
        assertion = !(lib.hasInfix "dflash" (lib.toLower cfg.modelDir));
        message = "services.qwen3090.modelDir contains \"dflash\": vLLM 0.28.0 would run the target as a DFlash drafter (gotcha 14); rename the directory.";
      }
      {
        assertion = builtins.all (t: pins.models ? ${t}) (builtins.attrNames cfg.fetchModel.revisions);
        message = "services.qwen3090.fetchModel.revisions names no target of the pins file; the targets are: ${lib.concatStringsSep ", " (builtins.attrNames pins.models)}.";
      }
      {
        # The module sets the first (the exporter's log file depends on it); the second at 0
        # makes vLLM refuse the first. Either from the user would be overridden or fatal.
        assertion =
          !(cfg.environment ? VLLM_LOGGING_CONFIG_PATH || cfg.environment ? VLLM_CONFIGURE_LOGGING);
        message = "services.qwen3090.environment sets VLLM_LOGGING_CONFIG_PATH or VLLM_CONFIGURE_LOGGING: the module sets vLLM's logging itself (journal plus ${serverLogFile} for the exporter); remove them (VLLM_LOGGING_LEVEL is honoured).";
      }
      {
        assertion = cfg.prometheus.scrape.enable -> builtins.pathExists ../prometheus/rules.yml;
        message = "services.qwen3090.prometheus.scrape: the rule file modules/prometheus/rules.yml is missing from this checkout.";
      }
    ];

    warnings =
      lib.optional (cfg.fetchModel.enable && unpinnedTargets != [ ])
        "services.qwen3090.fetchModel: no revision is pinned for ${lib.concatStringsSep ", " unpinnedTargets}; qwen3090-fetch-model.service refuses to download them (exit status ${toString unpinnedExit}, no retry, and qwen3090.service does not start) unless their directories under ${cfg.modelsDir} are already complete. Set ${lib.concatMapStringsSep ", " (t: "services.qwen3090.fetchModel.revisions.${t}") unpinnedTargets} to the commit you checked."
      ++ lib.optional (
      cfg.apiKeyFile == null
      && !(builtins.elem cfg.host [
        "127.0.0.1"
        "::1"
        "localhost"
      ])
    ) "services.qwen3090 binds ${cfg.host} without services.qwen3090.apiKeyFile: anyone who can reach port ${toString cfg.port} can use the model.";

    users = lib.mkIf staticUser {
      users.${cfg.user} = {
        isSystemUser = true;
        inherit (cfg) group;
        home = stateDir;
      };
      groups.${cfg.group} = { };
    };

    systemd.services.qwen3090 = {
      description = "Qwen3.8-27B on vLLM 0.28.0 (qwen3090, ${cfg.profile} profile)";
      wantedBy = [ "multi-user.target" ];
      after = [ "network.target" ] ++ lib.optional cfg.fetchModel.enable "qwen3090-fetch-model.service";
      requires = lib.optional cfg.fetchModel.enable "qwen3090-fetch-model.service";
      # A changed settings file or package restarts the server; the compile cache keeps that
      # restart warm unless the patch series changed.
      restartTriggers = [
        cfg.configFile
        cfg.package
      ];
      startLimitBurst = 5;
      startLimitIntervalSec = 3600;

      environment = cfg.environment // {
        HOME = stateDir;
        QWEN3090_MODELS_DIR = cfg.modelsDir;
        # qwen3090.caches derives every cache path from this base: the vLLM root keyed by the
        # series digest, inductor, Triton, FlashInfer, tvm-ffi, the CUDA JIT and HF_HOME.
        QWEN3090_CACHE_DIR = cfg.cacheDir;
        # Whatever else writes to ~/.cache lands in the cache directory too.
        XDG_CACHE_HOME = cfg.cacheDir;
        # The journal and ${serverLogFile} (loggingConfig above); the exporter reads the file.
        VLLM_LOGGING_CONFIG_PATH = loggingConfigFile;
      }
      // lib.optionalAttrs (cfg.apiKeyFile != null) {
        # The API_KEY_FILE knob of `qwen3090 serve`; %d is the unit's credentials directory
        # (LoadCredential below), so the key itself
        # stays out of the store, the unit file and the settings file.
        API_KEY_FILE = "%d/api-key";
      };

      serviceConfig =
        hardening
        // gpuAccess
        // lib.optionalAttrs staticUser { Group = cfg.group; }
        // {
          Type = "exec";
          User = userName;
          DynamicUser = true;
          StateDirectory = "qwen3090";
          StateDirectoryMode = "0750";
          WorkingDirectory = stateDir;
          # ${logsDir}, for server.log (the exporter's boot log). 0750 in both units that
          # name it: each start sets the mode again, so they must agree.
          LogsDirectory = "qwen3090";
          LogsDirectoryMode = "0750";
          ExecStartPre = [
            (utils.escapeSystemdExecArgs rotateLogArgv)
            (utils.escapeSystemdExecArgs checkModelArgv)
          ];
          ExecStart = utils.escapeSystemdExecArgs serveArgv;
          ExecStartPost = [ "${waitReady}" ];
          # vLLM drains in-flight requests and exits 0 on SIGINT; SIGTERM cuts them off.
          KillSignal = "SIGINT";
          # The SIGINT goes to the main process (the API server serve exec'd) alone, which
          # then stops its engine-core and worker processes in order; with the default
          # control-group mode every process got it at once and the engine died mid-drain.
          # Whatever is left after TimeoutStopSec still gets SIGKILL, cgroup-wide.
          KillMode = "mixed";
          TimeoutStopSec = 90;
          TimeoutStartSec = cfg.gpuGate.timeout + cfg.startTimeout;
          Restart = "on-failure";
          RestartSec = 30;
          EnvironmentFile = lib.optional (cfg.environmentFile != null) cfg.environmentFile;
          LoadCredential = lib.optional (cfg.apiKeyFile != null) "api-key:${cfg.apiKeyFile}";
        }
        // (
          if cacheUnderVarCache then
            {
              CacheDirectory = lib.removePrefix "/var/cache/" cfg.cacheDir;
              CacheDirectoryMode = "0750";
            }
          else
            { ReadWritePaths = [ cfg.cacheDir ]; }
        );
    };

    systemd.services.qwen3090-fetch-model = lib.mkIf cfg.fetchModel.enable {
      description = "Download the qwen3090 checkpoints into ${cfg.modelsDir}";
      wantedBy = [ "multi-user.target" ];
      before = [ "qwen3090.service" ];
      wants = [ "network-online.target" ];
      after = [ "network-online.target" ];
      environment = {
        HOME = stateDir;
        QWEN3090_MODELS_DIR = cfg.modelsDir;
        QWEN3090_CACHE_DIR = cfg.cacheDir;
        XDG_CACHE_HOME = cfg.cacheDir;
        HF_HUB_DISABLE_TELEMETRY = "1";
      }
      // lib.optionalAttrs (cfg.fetchModel.tokenFile != null) {
        # huggingface_hub reads the token from this file; the token stays out of the store.
        HF_TOKEN_PATH = "%d/hf-token";
      };
      unitConfig = {
        # A retry that finally succeeds starts the server whose start failed on this unit.
        OnSuccess = [ "qwen3090.service" ];
      };
      serviceConfig =
        hardening
        // lib.optionalAttrs staticUser { Group = cfg.group; }
        // {
          Type = "oneshot";
          User = userName;
          DynamicUser = true;
          StateDirectory = "qwen3090";
          StateDirectoryMode = "0750";
          WorkingDirectory = stateDir;
          # `qwen3090 fetch` checks each directory first: a complete one costs no network
          # call, so a reboot with the weights in place does not wait for the Hub.
          ExecStart = utils.escapeSystemdExecArgs (
            [
              qwen3090
              "fetch"
            ]
            ++ cfg.fetchModel.targets
            ++ [
              "--dest"
              cfg.modelsDir
            ]
            ++ lib.concatMap (t: [
              "--revision"
              "${t}=${cfg.fetchModel.revisions.${t}}"
            ]) (builtins.attrNames cfg.fetchModel.revisions)
          );
          # Bounded exponential back-off: 10 s doubling up to an hour, for what a retry can
          # fix (network, the Hub). A target without a revision cannot be fixed by waiting:
          # fetch refuses it with this status, and the unit fails once, saying so.
          RestartPreventExitStatus = [ unpinnedExit ];
          Restart = "on-failure";
          RestartSec = "10s";
          RestartSteps = 10;
          RestartMaxDelaySec = "1h";
          # A 27B checkpoint over a slow link takes hours; progress, not time, is the limit.
          TimeoutStartSec = "infinity";
          LoadCredential = lib.optional (
            cfg.fetchModel.tokenFile != null
          ) "hf-token:${cfg.fetchModel.tokenFile}";
          ReadWritePaths = lib.optional (!lib.hasPrefix "${stateDir}/" cfg.modelsDir) "-${cfg.modelsDir}";
        }
        // lib.optionalAttrs cacheUnderVarCache {
          CacheDirectory = lib.removePrefix "/var/cache/" cfg.cacheDir;
          CacheDirectoryMode = "0750";
        };
    };

    systemd.services.qwen3090-exporter = lib.mkIf cfg.exporter.enable {
      description = "Prometheus exporter of qwen3090 (chat canary, /health, build and boot facts)";
      wantedBy = [ "multi-user.target" ];
      after = [
        "network.target"
        "qwen3090.service"
      ];
      serviceConfig =
        hardening
        // lib.optionalAttrs staticUser { Group = cfg.group; }
        // {
          Type = "exec";
          User = userName;
          DynamicUser = true;
          # It talks HTTP to the server and reads the build manifest: no GPU, no JIT.
          PrivateDevices = true;
          MemoryDenyWriteExecute = true;
          StateDirectory = "qwen3090-exporter";
          StateDirectoryMode = "0700";
          # Relaxed: the exporter must see the server's log directory. Under DynamicUser=
          # systemd hides every unit's log directory but the unit's own (/var/log/private is
          # root-only, and the unit sees its own directories bound into it), so this unit
          # names the same LogsDirectory=; both run as the same user, so server.log (0600,
          # UMask 0077) is readable without widening any file mode.
          LogsDirectory = "qwen3090";
          LogsDirectoryMode = "0750";
          # ... and takes the write access that LogsDirectory= grants back: read only.
          ReadOnlyPaths = [ logsDir ];
          ExecStart = utils.escapeSystemdExecArgs (
            [
              qwen3090
              "exporter"
              "--host"
              cfg.host
              "--port"
              cfg.exporter.port
              "--vllm-url"
              "http://${reachableHost}:${toString cfg.port}"
              # The boot facts (KV pool, cold or warm compile; gotchas 2, 48) and the largest
              # pool this build reached, kept across restarts: what Qwen3090KvPoolShrunk needs.
              "--server-log"
              serverLogFile
              "--state-dir"
              exporterStateDir
            ]
            ++ lib.optionals (cfg.apiKeyFile != null) [
              # The canary needs the key; systemd puts credentials under this fixed path.
              "--api-key-file"
              "/run/credentials/qwen3090-exporter.service/api-key"
            ]
          );
          LoadCredential = lib.optional (cfg.apiKeyFile != null) "api-key:${cfg.apiKeyFile}";
          Restart = "on-failure";
          RestartSec = 10;
        };
    };

    services.prometheus = lib.mkIf cfg.prometheus.scrape.enable {
      scrapeConfigs = import ./scrape-configs.nix {
        inherit (cfg) profile;
        inherit (cfg.prometheus.scrape) interval;
        vllmTarget = "${reachableHost}:${toString cfg.port}";
        exporterTarget =
          if cfg.exporter.enable then "${reachableHost}:${toString cfg.exporter.port}" else null;
      };
      ruleFiles = [ ../prometheus/rules.yml ];
    };

    networking.firewall = lib.mkIf cfg.openFirewall {
      allowedTCPPorts = [ cfg.port ] ++ lib.optional cfg.exporter.enable cfg.exporter.port;
    };
  };
}
