# The parts of the repository each build reads, relative to its root: flake.nix turns them
# into filesets, and the nix-replay tier copies the same parts to run a check's script in the
# layout its derivation sees.
{
  # The qwen3090 package, its tests and what they read (checks, the wrapper).
  src = [
    "modules"
    "README.md"
    "checks"
    "flake.lock"
    "flake.nix"
    "nix"
    "patches"
    "python/benchmarks"
    "python/dev.sh"
    "python/docs"
    "python/pyproject.toml"
    "python/qwen3090"
    "python/tests"
  ];
  # The patched vLLM reads only the series and the tool that applies it, so a change
  # elsewhere in the Python package never rebuilds it.
  series = [
    "patches"
    "python/qwen3090/patchtool.py"
  ];
}
