# Prometheus scrape jobs for one qwen3090 deployment, as services.prometheus.scrapeConfigs
# entries. A plain function of plain values so that the module, the flake checks and the test
# suite render the very same jobs. vLLM's /metrics is outside the API-key guard (vLLM 0.28.0
# guards only /v1, /v2, /inference and /cohere), so the job needs no credentials.
{
  # "host:port" of the OpenAI-compatible server.
  vllmTarget,
  # "host:port" of `qwen3090 exporter`, or null when it does not run.
  exporterTarget ? null,
  profile ? "single-user",
  interval ? "15s",
}:
let
  # Every series carries the deployment's profile, so one Prometheus can watch both modes.
  labels = {
    inherit profile;
    service = "qwen3090";
  };
in
[
  {
    job_name = "qwen3090-vllm";
    metrics_path = "/metrics";
    scrape_interval = interval;
    static_configs = [
      {
        targets = [ vllmTarget ];
        inherit labels;
      }
    ];
  }
]
++ (
  if exporterTarget == null then
    [ ]
  else
    [
      {
        job_name = "qwen3090-exporter";
        metrics_path = "/metrics";
        scrape_interval = interval;
        static_configs = [
          {
            targets = [ exporterTarget ];
            inherit labels;
          }
        ];
      }
    ]
)
