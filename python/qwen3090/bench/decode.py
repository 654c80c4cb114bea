"""`bench decode`: decode tok/s per request from the server's own counters.

Seeds/004: under speculative decoding one SSE chunk can carry several tokens and rejected
drafts change the accounting, so the rate is ``usage.completion_tokens / (wall - ttft)`` and
never a chunk count. Gotcha 6: random-token prompts are meaningless for a drafter, so prompts
come from a file of real text. Gotcha 42: a fixed seed replays the same trajectory and, with
prefix caching, contaminates later calls, so every request gets its own seed. Gotcha 49: a
collapsed generation looks like a great acceptance rate, so a degenerate-output guard
(distinct-word ratio; drafted tokens per round above 1.2x the draft width) excludes those rows
and reports them before any summary is taken.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from qwen3090.bench import report
from qwen3090.errors import Qwen3090Error

DISTINCT_MIN = 0.30  # gotcha 49: 0.051 in a loop against 0.77-0.83 for ordinary text
DISTINCT_MIN_WORDS = 20  # fewer words say nothing about repetition
DRAFT_RATIO_MAX = 1.2  # gotcha 49: calibrated on 96 rows

SPEC_COUNTERS = {
    "drafts": "vllm:spec_decode_num_drafts_total",
    "draft_tokens": "vllm:spec_decode_num_draft_tokens_total",
    "accepted": "vllm:spec_decode_num_accepted_tokens_total",
}


def decode_rate(completion_tokens: int, wall_s: float, ttft_s: float | None) -> float | None:
    """Tokens per second after the first token; None when it cannot be measured."""
    if ttft_s is None or completion_tokens < 2:
        return None
    span = wall_s - ttft_s
    if span <= 0:
        return None
    # The first token arrived at ttft; the rest took (wall - ttft). completion_tokens is the
    # server's count, so speculative chunks carrying many tokens are counted right.
    return completion_tokens / span


def distinct_word_ratio(text: str) -> float | None:
    words = re.findall(r"\w+", text.lower())
    if len(words) < DISTINCT_MIN_WORDS:
        return None
    return len(set(words)) / len(words)


def parse_counters(metrics_text: str, names: Mapping[str, str]) -> dict[str, float]:
    """Sum each named counter over its label sets in a Prometheus exposition text."""
    out: dict[str, float] = {}
    for line in metrics_text.splitlines():
        if not line or line.startswith("#"):
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0]
        for key, metric in names.items():
            if name == metric:
                with contextlib.suppress(ValueError):
                    out[key] = out.get(key, 0.0) + float(line.rsplit(" ", 1)[-1])
    return out


@dataclass(frozen=True)
class SpecDelta:
    drafts: float
    draft_tokens: float
    accepted: float

    @property
    def tokens_per_step(self) -> float | None:
        return 1.0 + self.accepted / self.drafts if self.drafts else None

    @property
    def drafted_per_round(self) -> float | None:
        return self.draft_tokens / self.drafts if self.drafts else None


def spec_delta(before: Mapping[str, float], after: Mapping[str, float]) -> SpecDelta | None:
    if not all(k in after for k in SPEC_COUNTERS):
        return None
    d = {k: after[k] - before.get(k, 0.0) for k in SPEC_COUNTERS}
    return SpecDelta(d["drafts"], d["draft_tokens"], d["accepted"])


def degenerate_reasons(text: str, spec: SpecDelta | None, draft_width: int | None) -> list[str]:
    reasons = []
    ratio = distinct_word_ratio(text)
    if ratio is not None and ratio < DISTINCT_MIN:
        reasons.append(f"distinct-word ratio {ratio:.3f} < {DISTINCT_MIN}")
    if spec is not None and draft_width:
        per_round = spec.drafted_per_round
        if per_round is not None and per_round > DRAFT_RATIO_MAX * draft_width:
            reasons.append(
                f"drafted/round {per_round:.2f} > {DRAFT_RATIO_MAX} x width {draft_width}"
            )
    return reasons


def load_prompts(path: Path) -> list[str]:
    """One prompt per line, or JSONL objects with a "prompt" (or "question") field."""
    prompts = []
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line:
            continue
        if line.startswith("{"):
            obj = json.loads(line)
            prompts.append(str(obj.get("prompt") or obj.get("question") or ""))
        else:
            prompts.append(line)
    prompts = [p for p in prompts if p]
    if not prompts:
        raise Qwen3090Error(f"no prompts in {path}", fix="one real prompt per line")
    return prompts


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("decode", help="decode tok/s per request from usage counters")
    report.add_server_args(p)
    p.add_argument("--prompts", type=Path, required=True, help="real prompts, one per line")
    p.add_argument("--max-tokens", type=int, default=1024)
    p.add_argument("--repeat", type=int, default=1, help="passes over the prompt file")
    p.add_argument("--temperature", type=float, default=None, help="default: the server's")
    p.add_argument(
        "--seed-base", type=int, default=None, help="seed of request i is base+i (default random)"
    )
    p.add_argument(
        "--draft-width", type=int, default=None, help="num_speculative_tokens, for the guard"
    )
    p.add_argument("--no-thinking", action="store_true")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    client = report.client_from(args)
    prompts = load_prompts(args.prompts)
    seed_base = args.seed_base if args.seed_base is not None else random.randrange(1 << 30)
    extra: dict[str, Any] = {"max_tokens": args.max_tokens}
    if args.temperature is not None:
        extra["temperature"] = args.temperature
    if args.no_thinking:
        extra["chat_template_kwargs"] = {"enable_thinking": False}
    rows: list[dict[str, Any]] = []
    i = 0
    for _ in range(args.repeat):
        for prompt in prompts:
            before_text = client.metrics()
            before = parse_counters(before_text, SPEC_COUNTERS) if before_text else {}
            seed = seed_base + i
            res = client.chat_stream([{"role": "user", "content": prompt}], seed=seed, **extra)
            after_text = client.metrics()
            after = parse_counters(after_text, SPEC_COUNTERS) if after_text else {}
            spec = spec_delta(before, after) if after_text else None
            tokens = int(res.usage.get("completion_tokens") or 0)
            text = res.reasoning + res.text
            reasons = degenerate_reasons(text, spec, args.draft_width)
            rows.append(
                {
                    "i": i,
                    "seed": seed,
                    "prompt_tokens": res.usage.get("prompt_tokens"),
                    "completion_tokens": tokens,
                    "ttft_s": res.ttft_s,
                    "wall_s": res.wall_s,
                    "tok_s": decode_rate(tokens, res.wall_s, res.ttft_s),
                    "distinct": distinct_word_ratio(text),
                    "tok_per_step": spec.tokens_per_step if spec else None,
                    "drafted_per_round": spec.drafted_per_round if spec else None,
                    "degenerate": bool(reasons),
                    "why": "; ".join(reasons) or None,
                    "finish": res.finish_reason,
                }
            )
            i += 1
    good = [r for r in rows if not r["degenerate"]]
    summary = {
        "requests": len(rows),
        "excluded_degenerate": [r["i"] for r in rows if r["degenerate"]],
        "median_tok_s": report.finite_median([r["tok_s"] for r in good]),
        "median_ttft_s": report.finite_median([r["ttft_s"] for r in good]),
        "median_tok_per_step": report.finite_median([r["tok_per_step"] for r in good]),
        "seed_base": seed_base,
    }
    cols = [
        "i",
        "seed",
        "prompt_tokens",
        "completion_tokens",
        "ttft_s",
        "tok_s",
        "distinct",
        "tok_per_step",
        "drafted_per_round",
        "degenerate",
    ]
    print(report.format_table(rows, cols))
    print(
        f"median decode {summary['median_tok_s']} tok/s over {len(good)} rows "
        f"({len(rows) - len(good)} degenerate excluded); per-request rows of one sequence are "
        "dependent samples (gotcha 50)"
    )
    params = {
        "prompts": str(args.prompts),
        "max_tokens": args.max_tokens,
        "repeat": args.repeat,
        "draft_width": args.draft_width,
    }
    report.write_report(args.out, "decode", args, params, rows, summary)
    return 0
