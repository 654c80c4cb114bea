"""Run with vLLM: serve a (quantized) demo model, greedy, and report what was loaded.

argv: MODEL_DIR MODE(plain|mtp) OUT_JSON [SEQUENCES_JSON|self]. Writes {"tokens": [[ids...] per
prompt], "prompt_ids": [[ids...] per prompt], "layers": {module prefix: quant method class},
"lm_head_params": [...], "lm_head_w4a8": whether vLLM took its W4A8 kernel}, and
OUT_JSON.logits.pt: 256 fixed random hidden states and the served lm_head's logits for them,
plus with SEQUENCES_JSON (a list of token-id lists; "self": each prompt with this model's own
greedy answer) "top1": the model's top-1 next token at every position of each sequence
(teacher-forced, through prompt_logprobs), and under mtp the spec-decode counters and the
drafter's layer classes.
"""

import json
import os
import sys
from typing import Any

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
# collective_rpc ships a plain function to the worker only with this set.
os.environ["VLLM_ALLOW_INSECURE_SERIALIZATION"] = "1"

PROMPTS = [
    "Explain what a KV cache is.",
    "Write a Python function that adds two numbers.",
    "Count from one to ten.",
    "Describe a river in winter.",
    "What is the capital of the green mountain city?",
    "List three things to check before a release.",
]


def _methods(model: Any) -> dict[str, str]:
    """Quantization method class of every lm_head / linear layer of ``model``."""
    out: dict[str, str] = {}
    for name, module in model.named_modules():
        method = getattr(module, "quant_method", None)
        if method is None or not (name.endswith("lm_head") or "proj" in name or
                                  name.endswith(".fc")):
            continue
        inner = getattr(method, "scheme", None)
        out[name] = type(method).__name__ + (f"/{type(inner).__name__}" if inner else "")
    return out


def inspect(worker: Any, hidden: Any) -> dict[str, Any]:
    import torch

    runner = worker.model_runner
    report: dict[str, Any] = {"layers": _methods(runner.model)}
    lm_head = runner.model.lm_head
    report["lm_head_params"] = sorted(n for n, _ in lm_head.named_parameters())
    # On a CPU with AMX, vLLM serves int4 weights as W4A8 (int8 activations) by default.
    report["lm_head_w4a8"] = bool(getattr(lm_head, "use_w4a8", False))
    # The served lm_head's own logits for fixed hidden states, through its quant method
    # (the kernel that decodes the packed weights), for the caller to check against the file.
    with torch.no_grad():
        dtype = next(runner.model.parameters()).dtype
        # Tensors cross the RPC as nested lists.
        served = lm_head.quant_method.apply(lm_head, torch.tensor(hidden, dtype=dtype))
    report["served_logits"] = served.float().cpu().tolist()
    drafter = getattr(runner, "drafter", None)
    if drafter is not None:
        report["drafter_layers"] = _methods(drafter.model)
        report["drafter_shares_lm_head"] = drafter.model.lm_head is lm_head
    return report


def main() -> None:
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    model, mode, out = sys.argv[1], sys.argv[2], sys.argv[3]
    kwargs: dict[str, Any] = {
        "model": model, "max_model_len": 1024, "seed": 0, "enforce_eager": True,
        "disable_log_stats": False, "mamba_ssm_cache_dtype": "float32", "max_num_seqs": 4,
        # align-mode prefix caching runs a Triton copy kernel under speculation, which the
        # CPU build lacks
        "enable_prefix_caching": False,
    }
    if mode == "mtp":
        kwargs["speculative_config"] = {"method": "mtp", "num_speculative_tokens": 2}
    llm = LLM(**kwargs)
    conversations: Any = [[{"role": "user", "content": p}] for p in PROMPTS]
    results = llm.chat(conversations, SamplingParams(temperature=0.0, max_tokens=48),
                       use_tqdm=False)
    report: dict[str, Any] = {
        "tokens": [list(r.outputs[0].token_ids) for r in results],
        "prompt_ids": [list(r.prompt_token_ids or []) for r in results],
    }
    import torch

    hidden = torch.randn(256, llm.llm_engine.model_config.get_hidden_size(),
                         generator=torch.Generator().manual_seed(0))
    info = llm.collective_rpc(inspect, args=(hidden.tolist(),))[0]
    torch.save({"hidden": hidden, "logits": torch.tensor(info.pop("served_logits"))},
               out + ".logits.pt")
    report.update(info)
    if len(sys.argv) > 4:
        if sys.argv[4] == "self":  # the prompts with this model's own greedy answers
            sequences = [p + t for p, t in zip(report["prompt_ids"],
                                                           report["tokens"], strict=True)]
        else:
            with open(sys.argv[4]) as f:
                sequences = json.load(f)
        params = SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=1)
        scored = llm.generate([TokensPrompt(prompt_token_ids=s) for s in sequences], params,
                              use_tqdm=False)
        top1: list[list[int]] = []
        for r in scored:
            # Each entry holds the actual token and the rank-1 one; entry i scores token i
            # given the tokens before it (entry 0 is None).
            row = []
            for entry in (r.prompt_logprobs or [])[1:]:
                assert entry is not None
                row.append(next(int(t) for t, lp in entry.items() if lp.rank == 1))
            top1.append(row)
        report["top1"] = top1
    if mode == "mtp":
        for metric in llm.get_metrics():
            if metric.name.startswith("vllm:spec_decode_num_"):
                report[metric.name.removeprefix("vllm:spec_decode_num_")] = getattr(
                    metric, "value", None)
    with open(out, "w") as f:
        json.dump(report, f)


if __name__ == "__main__":
    main()
