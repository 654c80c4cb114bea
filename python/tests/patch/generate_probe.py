"""Run in a vLLM tree: greedy completions of a demo model, with or without MTP drafting.

argv: MODEL_DIR MODE(plain|mtp) OUT_JSON. Writes {"tokens": [[ids...] per prompt]}; under
mtp also "head": what the engine's own MTP head does with random hidden states (which ids
get a finite draft logit, which ids its greedy draft picks, and whether it drafts from a
copy of the listed lm_head rows), asked through collective_rpc.
"""

import json
import os
import sys
from typing import Any

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
# collective_rpc ships a plain function to the worker only with this set.
os.environ["VLLM_ALLOW_INSECURE_SERIALIZATION"] = "1"

from vllm import LLM, SamplingParams

PROMPTS = [
    "Explain what a KV cache is.",
    "Write a Python function that adds two numbers.",
    "Count from one to ten.",
    "Describe a river in winter.",
]


def inspect_head(worker: Any) -> dict[str, Any]:
    import torch

    head = worker.model_runner.drafter.model
    vocab = getattr(head, "draft_vocab", None)
    hidden = torch.randn(64, head.config.hidden_size, generator=torch.Generator().manual_seed(0))
    hidden = hidden.to(next(head.parameters()).dtype)
    with torch.no_grad():
        logits = head.compute_logits(hidden)
        top = head.get_top_tokens(hidden) if hasattr(head, "get_top_tokens") else None
    return {
        "top_token_ids": None if top is None else sorted(set(top.tolist())),
        "class": type(head).__name__,
        "finite_ids": sorted(torch.isfinite(logits).any(0).nonzero().flatten().tolist()),
        "argmax_ids": sorted(set(logits.argmax(-1).tolist())),
        "vocab_size": int(logits.shape[1]),
        "sub_weight": vocab is not None and vocab.weight is not None,
    }


def main() -> None:
    model, mode, out = sys.argv[1], sys.argv[2], sys.argv[3]
    kwargs: dict[str, Any] = {
        "model": model, "max_model_len": 1024, "seed": 0, "enforce_eager": True,
        "disable_log_stats": False,  # the spec-decode counters below
        "mamba_ssm_cache_dtype": "float32", "max_num_seqs": 4,
        # align-mode prefix caching runs a Triton copy kernel under speculation, which the
        # CPU build lacks
        "enable_prefix_caching": False,
    }
    if mode == "mtp":
        kwargs["speculative_config"] = {"method": "mtp", "num_speculative_tokens": 2}
    llm = LLM(**kwargs)
    params = SamplingParams(temperature=0.0, max_tokens=48)
    conversations: Any = [[{"role": "user", "content": p}] for p in PROMPTS]
    results = llm.chat(conversations, params,
                       use_tqdm=False)
    report: dict[str, Any] = {"tokens": [list(r.outputs[0].token_ids) for r in results]}
    if mode == "mtp":
        report["head"] = llm.collective_rpc(inspect_head)[0]
        for metric in llm.get_metrics():
            if metric.name.startswith("vllm:spec_decode_num_"):
                report[metric.name.removeprefix("vllm:spec_decode_num_")] = getattr(
                    metric, "value", None)
    with open(out, "w") as f:
        json.dump(report, f)


if __name__ == "__main__":
    main()
