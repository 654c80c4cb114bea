"""``qwen3090 demo-model DIR``: generate a tiny random-weight model that vLLM serves."""

from __future__ import annotations

import argparse
from pathlib import Path


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from qwen3090.demo_model import ARCHS, DEFAULT_ARCH

    p = subparsers.add_parser(
        "demo-model",
        help="generate a tiny random-weight model with a trained BPE tokenizer (offline)",
        description="Write a tiny random-weight model into DIR: a byte-level BPE tokenizer "
        "trained here, a chat template with <think>, config.json and safetensors weights. "
        "For the CPU tier (`MODEL=DIR qwen3090 serve --device cpu`) and the tests.",
    )
    p.add_argument("dir", type=Path, metavar="DIR", help="where to write it (created)")
    p.add_argument(
        "--arch", choices=ARCHS, default=DEFAULT_ARCH,
        help="qwen3: attention only; qwen3_next: hybrid Gated DeltaNet + attention (default: "
        "the recurrent-state prefix cache of the real model); qwen3_5: the real model's class, "
        "which stock vLLM 0.28.0 imports only together with its vision code (needs torchvision; "
        "the qwen3_5-text-only-imports patch of the series lifts that)",
    )
    p.add_argument("--seed", type=int, default=0, help="weights and tokenizer seed")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from qwen3090.demo_model import write_demo_model

    model = write_demo_model(args.dir, args.arch, args.seed)
    print(f"wrote {model.architecture} ({model.arch}, vocab {model.vocab_size}) to {model.path}")
    return 0
