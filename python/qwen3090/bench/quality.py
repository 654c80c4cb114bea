"""`bench quality`: is the output still right? Perplexity and GSM8K exact match.

Gotcha 1: a benchmark cannot tell you the output is garbage; an int8 path served nonsense for
an hour of good throughput numbers before a perplexity check caught it. Run this before
believing any tok/s figure. Two traps of the measurement itself: ``prompt_logprobs`` on long
prompts OOMs the engine above ``GPU_UTIL`` 0.93 on a 3090 (gotcha 9), and is silently wrong
(and sometimes NaN) under MTP + KVarN with prefix caching on (gotcha 46).
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from qwen3090.bench import report
from qwen3090.bench.client import Client, cache_config_info
from qwen3090.errors import Qwen3090Error

ANSWER_RE = re.compile(r"####\s*([^\n]+)")
NUMBER_RE = re.compile(r"-?\$?\d[\d,]*(?:\.\d+)?")
GSM8K_SUFFIX = "\nSolve the problem. End with a line of the form '#### <number>'."


def normalize_number(text: str) -> str | None:
    """'$1,234.50' -> '1234.5'; None when there is no number."""
    m = NUMBER_RE.search(text)
    if not m:
        return None
    raw = m.group(0).replace(",", "").replace("$", "")
    if "." in raw:
        raw = raw.rstrip("0").rstrip(".")
    if raw in ("-0", ""):
        raw = "0"
    return raw


def reference_answer(answer_field: str) -> str | None:
    """GSM8K's reference: the number after '####'."""
    m = ANSWER_RE.search(answer_field)
    return normalize_number(m.group(1)) if m else normalize_number(answer_field)


def extract_answer(response: str) -> str | None:
    """The model's answer: the number after its last '####', else its last number."""
    marks = ANSWER_RE.findall(response)
    if marks:
        return normalize_number(marks[-1])
    numbers = NUMBER_RE.findall(response)
    return normalize_number(numbers[-1]) if numbers else None


def perplexity(logprobs: Sequence[float]) -> float:
    """exp of the mean negative log-likelihood; NaN when any logprob is not finite."""
    if not logprobs:
        raise ValueError("no logprobs")
    if not all(math.isfinite(lp) for lp in logprobs):
        return float("nan")
    return math.exp(-sum(logprobs) / len(logprobs))


def chunk_text(text: str, chunk_chars: int) -> list[str]:
    """Whitespace-aligned pieces of about ``chunk_chars`` characters."""
    words = text.split()
    chunks: list[str] = []
    cur: list[str] = []
    size = 0
    for w in words:
        if cur and size + len(w) + 1 > chunk_chars:
            chunks.append(" ".join(cur))
            cur, size = [], 0
        cur.append(w)
        size += len(w) + 1
    if cur:
        chunks.append(" ".join(cur))
    return chunks


def prompt_token_logprobs(entries: Sequence[Any]) -> list[float]:
    """The prompt tokens' own logprobs from vLLM's ``prompt_logprobs`` (first entry is None).

    With ``prompt_logprobs=0`` each position maps token id -> {logprob, rank, ...} for just
    the prompt's own token, so the single entry is the one we want.
    """
    out: list[float] = []
    for pos in entries:
        if not pos:
            continue
        if len(pos) != 1:
            raise Qwen3090Error(
                "prompt_logprobs returned more than the prompt token; expected k=0 entries",
                fix="point --server at a vLLM server (its prompt_logprobs=0 returns only the "
                "prompt's own token per position)",
            )
        (entry,) = pos.values()
        lp = entry["logprob"] if isinstance(entry, dict) else entry
        out.append(float(lp) if lp is not None else float("nan"))
    return out


def load_gsm8k(path: Path) -> list[tuple[str, str]]:
    items = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        obj = json.loads(line)
        ref = reference_answer(str(obj.get("answer", "")))
        if "question" not in obj or ref is None:
            raise Qwen3090Error(
                f"{path}:{n}: expected GSM8K format {{'question', 'answer': '... #### N'}}",
                fix="give --gsm8k a JSONL file with one such object per line",
            )
        items.append((str(obj["question"]), ref))
    return items


def server_warnings(metrics_text: str | None) -> list[str]:
    """Warnings for the two configurations where prompt_logprobs misleads (gotchas 9, 46)."""
    notes = []
    info = cache_config_info(metrics_text)
    spec = "vllm:spec_decode_num_drafts" in (metrics_text or "")
    util = info.get("gpu_memory_utilization")
    if util is not None:
        try:
            if float(util) > 0.93:
                notes.append(
                    f"the server runs at gpu_memory_utilization {util}: prompt_logprobs on "
                    "long prompts can OOM the engine on a 3090; run quality checks at "
                    "GPU_UTIL=0.93 (gotcha 9)"
                )
        except ValueError:
            pass
    if (
        info.get("enable_prefix_caching") == "True"
        and info.get("cache_dtype", "").startswith("kvarn")
        and spec
    ):
        notes.append(
            "prefix caching is on with a KVarN cache and a speculator: under MTP the "
            "prompt_logprobs come back ~23% worse or NaN; measure with PREFIX_CACHE=0 (gotcha 46)"
        )
    if not info:
        notes.append(
            "cannot read the server's cache config: make sure it runs at GPU_UTIL<=0.93 "
            "(gotcha 9) and, under SPEC=mtp with KVarN, PREFIX_CACHE=0 (gotcha 46)"
        )
    return notes


def run_ppl(client: Client, text: str, chunk_chars: int) -> tuple[list[dict[str, Any]], float]:
    rows = []
    all_lp: list[float] = []
    for i, chunk in enumerate(chunk_text(text, chunk_chars)):
        resp = client.completion(chunk, max_tokens=1, temperature=0.0, prompt_logprobs=0)
        lps = prompt_token_logprobs(resp["choices"][0].get("prompt_logprobs") or [])
        all_lp += lps
        rows.append({"kind": "ppl", "chunk": i, "tokens": len(lps), "ppl": perplexity(lps)})
    return rows, perplexity(all_lp)


def run_gsm8k(
    client: Client, items: Sequence[tuple[str, str]], max_tokens: int, extra: dict[str, Any]
) -> tuple[list[dict[str, Any]], float]:
    rows = []
    correct = 0
    for i, (question, ref) in enumerate(items):
        resp = client.chat(
            [{"role": "user", "content": question + GSM8K_SUFFIX}],
            max_tokens=max_tokens,
            temperature=0.0,
            **extra,
        )
        msg = resp["choices"][0]["message"]
        got = extract_answer(msg.get("content") or "")
        ok = got is not None and got == ref
        correct += ok
        rows.append({"kind": "gsm8k", "item": i, "expected": ref, "got": got, "correct": ok})
    return rows, correct / len(items) if items else float("nan")


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("quality", help="perplexity and GSM8K exact match; gate on thresholds")
    report.add_server_args(p)
    p.add_argument("--text", type=Path, default=None, help="text for perplexity")
    p.add_argument("--chunk-chars", type=int, default=2000)
    p.add_argument("--gsm8k", type=Path, default=None, help="GSM8K-format JSONL")
    p.add_argument("--limit", type=int, default=None, help="first N GSM8K items")
    p.add_argument("--max-tokens", type=int, default=512)
    p.add_argument("--max-ppl", type=float, default=None, help="fail above this perplexity")
    p.add_argument("--min-accuracy", type=float, default=None, help="fail below this (0..1)")
    p.add_argument("--no-thinking", action="store_true")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.text is None and args.gsm8k is None:
        raise Qwen3090Error("nothing to measure", fix="give --text FILE and/or --gsm8k FILE")
    client = report.client_from(args)
    for note in server_warnings(client.metrics()):
        print(f"warning: {note}", file=sys.stderr)
    rows: list[dict[str, Any]] = []
    summary: dict[str, Any] = {}
    failures: list[str] = []
    if args.text is not None:
        ppl_rows, ppl = run_ppl(client, args.text.read_text(), args.chunk_chars)
        rows += ppl_rows
        summary["perplexity"] = ppl
        summary["ppl_tokens"] = sum(int(r["tokens"]) for r in ppl_rows)
        if not math.isfinite(ppl):
            failures.append("perplexity is not finite (gotcha 46: NaN logprobs)")
        elif args.max_ppl is not None and ppl > args.max_ppl:
            failures.append(f"perplexity {ppl:.4f} > --max-ppl {args.max_ppl}")
    if args.gsm8k is not None:
        items = load_gsm8k(args.gsm8k)[: args.limit]
        extra = {"chat_template_kwargs": {"enable_thinking": False}} if args.no_thinking else {}
        gsm_rows, acc = run_gsm8k(client, items, args.max_tokens, extra)
        rows += gsm_rows
        summary["accuracy"] = acc
        summary["gsm8k_items"] = len(items)
        if args.min_accuracy is not None and not acc >= args.min_accuracy:
            failures.append(f"accuracy {acc:.3f} < --min-accuracy {args.min_accuracy}")
    summary["failures"] = failures
    if any(r["kind"] == "ppl" for r in rows):
        print(
            report.format_table([r for r in rows if r["kind"] == "ppl"], ["chunk", "tokens", "ppl"])
        )
    if any(r["kind"] == "gsm8k" for r in rows):
        print(
            report.format_table(
                [r for r in rows if r["kind"] == "gsm8k"], ["item", "expected", "got", "correct"]
            )
        )
    line = []
    if "perplexity" in summary:
        line.append(f"perplexity {summary['perplexity']:.4f} over {summary['ppl_tokens']} tokens")
    if "accuracy" in summary:
        line.append(f"GSM8K exact match {summary['accuracy']:.3f} of {summary['gsm8k_items']}")
    print("; ".join(line))
    params = {
        "text": str(args.text),
        "gsm8k": str(args.gsm8k),
        "max_ppl": args.max_ppl,
        "min_accuracy": args.min_accuracy,
    }
    report.write_report(args.out, "quality", args, params, rows, summary)
    for f in failures:
        print(f"FAILED: {f}", file=sys.stderr)
    return 1 if failures else 0
