#!/usr/bin/env python3
"""Give a ``qwen3090 demo-model`` model a sharp, looping greedy output, for the SPEC=dflash2 lives.

    python3 python/tests/gpu/cycle_head.py MODEL_DIR

Why: the demo model's random weights (std 0.02) leave its logits within a few bf16 steps of
each other; on the CPU half of a greedy copy's tokens had their top two within 0.05 nats and 3 %
tied exactly, so a verify block of another length (what lookup drafting changes) rounds them
the other way, and "greedy output identical with and without lookup" would test rounding, not
the lookup.

What: the embedding gets unit-scale rows, so the residual stream stays close to the input
token's row through the four random layers; the LM head's row for token ``next[x]`` is token
``x``'s embedding direction, where ``next`` is a seeded permutation made of cycles of
``PERIOD`` tokens. The target then predicts ``next[x]`` after ``x`` by several nats (the other
rows are near-orthogonal random directions), so its greedy text walks a cycle: context that
repeats, which the lookup can match, with no near-ties. All the model's kernels run as before.
Idempotent for a given seed.
"""

from __future__ import annotations

import sys
from pathlib import Path

PERIOD = 46


def successor(vocab: int, period: int, seed: int) -> list[int]:
    """``next[x]``: a permutation of ``range(vocab)`` whose cycles have ``period`` tokens (the
    last one what is left over)."""
    import random

    order = list(range(vocab))
    random.Random(seed).shuffle(order)
    nxt = [0] * vocab
    for start in range(0, vocab, period):
        cycle = order[start:start + period]
        for i, tok in enumerate(cycle):
            nxt[tok] = cycle[(i + 1) % len(cycle)]
    return nxt


def add_cycle_head(model: Path, seed: int = 0) -> list[int]:
    """Rewrite the embedding and the LM head of ``model``; returns ``next``."""
    import torch
    from safetensors.torch import load_file, save_file

    weights = load_file(str(model / "model.safetensors"))
    for key in ("model.embed_tokens.weight", "lm_head.weight"):
        if key not in weights:
            raise SystemExit(f"{model}/model.safetensors has no {key}: not a demo model with "
                             "untied embeddings (qwen3090 demo-model --arch qwen3_5)")
    vocab, hidden = weights["model.embed_tokens.weight"].shape
    gen = torch.Generator().manual_seed(seed)
    embed = torch.randn(vocab, hidden, generator=gen)
    nxt = successor(vocab, PERIOD, seed)
    head = torch.empty(vocab, hidden)
    head[torch.tensor(nxt)] = embed / embed.norm(dim=1, keepdim=True)
    weights["model.embed_tokens.weight"] = embed.to(torch.bfloat16).contiguous()
    weights["lm_head.weight"] = head.to(torch.bfloat16).contiguous()
    save_file(weights, str(model / "model.safetensors"), metadata={"format": "pt"})
    return nxt


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    add_cycle_head(Path(sys.argv[1]))
    print(f"cycle head: period {PERIOD}")
