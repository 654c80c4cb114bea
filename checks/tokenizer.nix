# `qwen3090 check model` accepts the generated demo model and refuses the same directory
# without tokenizer.json (an empty vocabulary to transformers; gotcha 32).
{
  runCommand,
  qwen3090,
}:
runCommand "qwen3090-check-tokenizer" { nativeBuildInputs = [ qwen3090 ]; } ''
  export HOME=$TMPDIR
  qwen3090-python - <<'PY'
  from pathlib import Path
  from qwen3090.demo_model import write_demo_model
  write_demo_model(Path("demo"))
  PY
  qwen3090 check model demo

  cp -r demo no-tokenizer
  rm no-tokenizer/tokenizer.json
  if qwen3090 check model no-tokenizer 2> refused.txt; then
    echo "a model dir without tokenizer.json passed the check" >&2
    exit 1
  fi
  grep -q tokenizer refused.txt
  cp refused.txt $out
''
