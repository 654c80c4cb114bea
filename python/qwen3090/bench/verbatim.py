"""`bench verbatim`: can the server copy a document back? Scored by coverage.

Gotcha 33: the same broken configuration came back as an empty answer, as one character, and
as 400 tokens of fluent text that copied nothing. A rule that waits for a symptom (repeats, a
short prefix) misfiles at least one of those. The one property all three share is that the copy
did not come back, so rows are decided on *coverage*: the fraction of the answer's 40-character
windows that occur in the source, compared with the median of the other rows of the same run.
Prefix match and repeats are reported beside it but decide nothing.
"""

from __future__ import annotations

import argparse
import statistics
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from qwen3090.bench import report
from qwen3090.bench.client import Client, cached_tokens

WINDOW = 40
DEFAULT_MARGIN = 0.25
INSTRUCTION = (
    "Reproduce the following document exactly, character for character, with no commentary "
    "before or after it.\n\n"
)


def _windows(text: str, width: int) -> list[str]:
    return [text[i : i + width] for i in range(len(text) - width + 1)]


def coverage(answer: str, source: str, window: int = WINDOW) -> float:
    """Fraction of the answer's ``window``-character windows that occur in ``source``.

    An answer shorter than one window (the empty and one-character failures) scores 0, unless
    the whole source is shorter than a window and the answer is exactly it.
    """
    width = min(window, len(source))
    if width == 0 or len(answer) < width:
        return 0.0
    if width < window:
        return 1.0 if answer.strip() == source.strip() else 0.0
    known = set(_windows(source, width))
    got = _windows(answer, width)
    return sum(1 for w in got if w in known) / len(got)


def prefix_match(answer: str, source: str) -> int:
    """Characters of the answer that match the source from its start (reported only)."""
    n = 0
    for a, b in zip(answer, source, strict=False):
        if a != b:
            break
        n += 1
    return n


def max_repeats(answer: str, window: int = WINDOW) -> int:
    """How often the answer's most frequent non-overlapping-agnostic window occurs (reported)."""
    got = _windows(answer, window)
    return max(Counter(got).values()) if got else 0


@dataclass(frozen=True)
class Score:
    coverage: float
    prefix: int
    repeats: int
    answer_chars: int
    source_chars: int


def score(answer: str, source: str, window: int = WINDOW) -> Score:
    return Score(
        coverage=coverage(answer, source, window),
        prefix=prefix_match(answer, source),
        repeats=max_repeats(answer, window),
        answer_chars=len(answer),
        source_chars=len(source),
    )


def flag_low(values: Mapping[Any, float], margin: float = DEFAULT_MARGIN) -> dict[Any, float]:
    """Rows whose value is below the median of the OTHER rows by more than ``margin``.

    Returns {row key: that median}. With fewer than two rows nothing can be compared.
    """
    flagged: dict[Any, float] = {}
    if len(values) < 2:
        return flagged
    for key, value in values.items():
        others = [v for k, v in values.items() if k != key]
        med = statistics.median(others)
        if value < med - margin:
            flagged[key] = med
    return flagged


def reproduce_messages(document: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": INSTRUCTION + document}]


def run_one(
    client: Client, document: str, max_tokens: int, extra: Mapping[str, Any]
) -> dict[str, Any]:
    resp = client.chat(
        reproduce_messages(document), max_tokens=max_tokens, temperature=0.0, **extra
    )
    choice = resp["choices"][0]
    answer = choice["message"].get("content") or ""
    usage = resp.get("usage") or {}
    s = score(answer, document)
    return {
        "coverage": s.coverage,
        "prefix": s.prefix,
        "repeats": s.repeats,
        "answer_chars": s.answer_chars,
        "source_chars": s.source_chars,
        "finish": choice.get("finish_reason"),
        "answer": answer,
        "prompt_tokens": usage.get("prompt_tokens"),
        "cached_tokens": cached_tokens(usage),
        "completion_tokens": usage.get("completion_tokens"),
    }


def parse_lengths(text: str) -> list[int]:
    return [int(x) for x in text.replace(" ", "").split(",") if x]


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "verbatim",
        help="ask the server to copy a document back; decide each length on coverage",
    )
    report.add_server_args(p)
    p.add_argument("--doc", type=Path, required=True, help="the document (a text file)")
    p.add_argument(
        "--lengths",
        default="1000,2000,4000,8000",
        help="comma-separated document prefixes in characters, one row each",
    )
    p.add_argument("--max-tokens", type=int, default=None, help="default: about the doc size")
    p.add_argument("--margin", type=float, default=DEFAULT_MARGIN)
    p.add_argument(
        "--no-thinking",
        action="store_true",
        help="pass chat_template_kwargs enable_thinking=false (Qwen3 templates)",
    )
    p.set_defaults(func=run)


def template_extra(args: argparse.Namespace) -> dict[str, Any]:
    if getattr(args, "no_thinking", False):
        return {"chat_template_kwargs": {"enable_thinking": False}}
    return {}


def decide(rows: Sequence[dict[str, Any]], key: str, margin: float) -> dict[str, Any]:
    values = {i: float(r["coverage"]) for i, r in enumerate(rows)}
    flagged = flag_low(values, margin)
    for i, r in enumerate(rows):
        r["flag"] = i in flagged
        r["others_median"] = flagged.get(i)
    return {
        "median_coverage": statistics.median(values.values()) if values else None,
        "flagged": [rows[i][key] for i in sorted(flagged)],
        "margin": margin,
    }


def run(args: argparse.Namespace) -> int:
    text = args.doc.read_text()
    client = report.client_from(args)
    rows: list[dict[str, Any]] = []
    extra = template_extra(args)
    for length in parse_lengths(args.lengths):
        doc = text[:length]
        max_tokens = args.max_tokens or max(16, len(doc) // 2)
        row = {"chars": len(doc), **run_one(client, doc, max_tokens, extra)}
        rows.append(row)
    summary = decide(rows, "chars", args.margin)
    cols = ["chars", "prompt_tokens", "coverage", "prefix", "repeats", "answer_chars", "finish"]
    print(report.format_table(rows, [*cols, "flag"]))
    print(f"median coverage {summary['median_coverage']}; flagged: {summary['flagged'] or 'none'}")
    report.write_report(args.out, "verbatim", args, {"lengths": args.lengths}, rows, summary)
    return 1 if summary["flagged"] else 0
