"""Subcommands of the ``qwen3090`` CLI.

Every module in this package is a subcommand: it defines ``register(subparsers)``, which adds
its parser and sets ``func`` (``Callable[[argparse.Namespace], int]``) as a default. Modules
here must import nothing heavy (vLLM, torch, transformers) at import time: ``qwen3090 plan``
has to answer in a fraction of a second on a machine without either.
"""
