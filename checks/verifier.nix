# The built vLLM carries every patch of the series (the verifier: exact reverse dry-run per
# patch), imports, and is the vLLM and torch the pins name.
{
  runCommand,
  gnupatch,
  qwen3090,
  pins,
}:
runCommand "qwen3090-check-verifier"
  {
    nativeBuildInputs = [
      qwen3090
      gnupatch
    ];
  }
  ''
    qwen3090 verify patches --vllm-root ${qwen3090.vllm.sitePackages} --json > verify.json
    cat verify.json
    qwen3090-python - <<'PY'
    import torch, vllm
    assert vllm.__version__ == "${pins.vllmVersion}", vllm.__version__
    assert torch.__version__.split("+")[0] == "${pins.torchVersion}", torch.__version__
    print("vllm", vllm.__version__, "torch", torch.__version__)
    PY
    cp verify.json $out
  ''
