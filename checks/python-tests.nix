# The unit tier of the Python test suite on the pinned closure (the other tiers need a vLLM
# CPU build, PyPI or nix-instantiate, which the sandbox does not have).
{
  runCommand,
  qwen3090,
  testTools,
  src,
}:
runCommand "qwen3090-check-python-tests" { nativeBuildInputs = [ qwen3090 ]; } ''
  export HOME=$TMPDIR
  cp -r ${src}/python source
  chmod -R u+w source
  cd source
  PYTHONPATH=${testTools}/${qwen3090.python.sitePackages} \
    qwen3090-python -m pytest -m unit -p no:cacheprovider -q tests | tee $out
''
