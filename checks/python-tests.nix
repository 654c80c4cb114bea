# The unit tier of the Python test suite on the pinned closure (the other tiers need a vLLM
# CPU build, PyPI or nix-instantiate, which the sandbox does not have). The tests read files
# beside python/ (patches/series, modules/prometheus/rules.yml), so the whole filtered source
# is copied and pytest runs in its python/ directory, as in a checkout; the nix-replay tier
# runs this script in the same layout.
{
  runCommand,
  qwen3090,
  testTools,
  src,
}:
runCommand "qwen3090-check-python-tests" { nativeBuildInputs = [ qwen3090 ]; } ''
  export HOME=$TMPDIR
  cp -r ${src} source
  chmod -R u+w source
  cd source/python
  PYTHONPATH=${testTools}/${qwen3090.python.sitePackages} \
    qwen3090-python -m pytest -m unit -p no:cacheprovider -q tests | tee $out
''
