"""`bench residues`: copy fidelity at every chat-templated prompt length mod 128.

Gotcha 33 / seeds 001: with a prefix-cache hit, one templated prompt length in every 128 can
corrupt the answer. So: step the pad ONE token at a time so each residue is hit exactly once
(five sampled residues miss one broken residue 123/128 = 96% of the time); count the length
AFTER the chat template, as the engine sees it (the raw count is 12 tokens off on Qwen3); arm
the prefix cache with a warm-up of the identical request before the measured one; and, when
the question is "this length" rather than "this length after that history", give every length
a fresh server. Rows are decided on verbatim coverage against the run's median.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from qwen3090.bench import report, verbatim
from qwen3090.bench.client import Client, cache_config_info, cached_tokens
from qwen3090.errors import Qwen3090Error
from qwen3090.localserver import LocalServer, start_server

MODULUS = 128
PAD_UNIT = " the"
# Pad units to try, in order: the first that costs exactly one token per repetition in the
# server's tokenizer is used, so the pad steps the templated length one token at a time.
PAD_CANDIDATES = (" the", " a", " x", " is", " 1", ".", " pad")
PAD_FALLBACKS = (" x", ".", " ,")


def residue(length: int, modulus: int = MODULUS) -> int:
    return length % modulus


def messages_for(document: str, pad: str) -> list[dict[str, Any]]:
    # The pad sits in the instruction, the document stays byte-identical across lengths, so a
    # broken row is the token count and not the corpus (gotcha 33).
    return [
        {
            "role": "user",
            "content": f"{verbatim.INSTRUCTION.rstrip()}{pad}\n\n{document}",
        }
    ]


def choose_pad_unit(count: Callable[[str], int]) -> str:
    """The first candidate unit whose repetitions cost exactly one templated token each."""
    base = count("")
    for unit in PAD_CANDIDATES:
        if all(count(unit * k) - base == k for k in (1, 2, 3, 8)):
            return unit
    raise Qwen3090Error(
        "no pad unit tokenizes to one token per repetition with this tokenizer",
        fix="report the tokenizer; residues.PAD_CANDIDATES needs a unit for it",
    )


def find_pad(
    count: Callable[[str], int],
    target: int,
    start_units: int,
    unit: str = PAD_UNIT,
    max_tries: int = 64,
) -> tuple[str, int]:
    """A pad whose messages template to exactly ``target`` tokens; returns (pad, units used).

    ``count(pad)`` is the templated token count. The pad is ``unit`` repeated, with one of a
    few single-token fallbacks appended when a merge skips the target.
    """
    units = max(0, start_units)
    seen: dict[int, int] = {}
    for _ in range(max_tries):
        got = count(unit * units)
        seen[units] = got
        if got == target:
            return unit * units, units
        step = target - got
        nxt = units + (step if abs(step) > 1 else (1 if step > 0 else -1))
        if nxt < 0 or nxt in seen:
            break
        units = nxt
    for base_units, got in sorted(seen.items()):
        if got == target - 1 or got == target - 2:
            for tail in PAD_FALLBACKS:
                for reps in (1, 2):
                    pad = unit * base_units + tail * reps
                    if count(pad) == target:
                        return pad, base_units
    raise Qwen3090Error(
        f"could not build a prompt of exactly {target} templated tokens",
        fix="use another --doc or a different --start length",
    )


class FreshServer:
    """A server started per length from a command template with {port}."""

    def __init__(self, command: str, port: int, env: Mapping[str, str], log_dir: Path) -> None:
        self.command = command
        self.port = port
        self.env = dict(env)
        self.log_dir = log_dir
        self.server: LocalServer | None = None

    def start(self, tag: str, timeout_s: float) -> float:
        argv = shlex.split(self.command.format(port=self.port))
        self.server = start_server(argv, self.env, self.port, self.log_dir / f"server-{tag}.log")
        try:
            return self.server.wait_healthy(timeout_s, poll_s=0.5)
        except Qwen3090Error:
            self.stop()
            raise

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()
            self.server = None


def measure(
    client: Client,
    document: str,
    pad: str,
    max_tokens: int,
    extra: Mapping[str, Any],
    warmups: int,
) -> dict[str, Any]:
    msgs = messages_for(document, pad)
    params = {"max_tokens": max_tokens, "temperature": 0.0, **extra}
    for _ in range(warmups):
        client.chat(msgs, **params)  # arms the prefix cache with this exact prompt
    resp = client.chat(msgs, **params)
    choice = resp["choices"][0]
    answer = choice["message"].get("content") or ""
    usage = resp.get("usage") or {}
    s = verbatim.score(answer, document)
    return {
        "prompt_tokens": usage.get("prompt_tokens"),
        "cached_tokens": cached_tokens(usage),
        "coverage": s.coverage,
        "prefix": s.prefix,
        "repeats": s.repeats,
        "answer_chars": s.answer_chars,
        "finish": choice.get("finish_reason"),
        "answer": answer,
    }


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "residues",
        help="sweep the templated prompt length across residues mod 128, one token at a time",
    )
    report.add_server_args(p)
    p.add_argument("--doc", type=Path, required=True, help="the document to copy")
    p.add_argument("--doc-chars", type=int, default=4000, help="use this prefix of --doc")
    p.add_argument(
        "--start", type=int, default=None, help="first templated length (default: doc + pad)"
    )
    p.add_argument(
        "--count",
        type=int,
        default=MODULUS,
        help="lengths to sweep, one token apart (128 = every residue once; fewer only for CI)",
    )
    p.add_argument("--warmups", type=int, default=1, help="identical requests before measuring")
    p.add_argument("--max-tokens", type=int, default=None)
    p.add_argument("--margin", type=float, default=verbatim.DEFAULT_MARGIN)
    p.add_argument("--no-thinking", action="store_true")
    p.add_argument(
        "--fresh-server",
        default=None,
        metavar="COMMAND",
        help="start a server per length with this command ({port} is replaced); "
        "--server must then point at that port",
    )
    p.add_argument("--fresh-port", type=int, default=None)
    p.add_argument("--fresh-timeout", type=float, default=600.0)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    document = args.doc.read_text()[: args.doc_chars]
    client = report.client_from(args)
    extra = verbatim.template_extra(args)
    max_tokens = args.max_tokens or max(16, len(document) // 2)
    if args.count < MODULUS:
        print(
            f"note: sweeping {args.count} of {MODULUS} residues; a clean partial sweep proves "
            "nothing about the residues it skipped"
        )
    fresh: FreshServer | None = None
    log_dir = Path(tempfile.mkdtemp(prefix="qwen3090-residues-"))
    if args.fresh_server:
        port = args.fresh_port or int(client.root.rsplit(":", 1)[-1])
        fresh = FreshServer(args.fresh_server, port, os.environ, log_dir)

    rows: list[dict[str, Any]] = []
    try:
        if fresh is not None:
            fresh.start("plan", args.fresh_timeout)
        kwargs = extra.get("chat_template_kwargs")

        def count(pad: str) -> int:
            return client.count_chat_tokens(messages_for(document, pad), kwargs)

        base = count("")
        start = args.start if args.start is not None else base + 1
        if start <= base:
            raise Qwen3090Error(
                f"--start {start} is not above the unpadded length {base}",
                fix=f"pass a --start above {base}, or leave it out (one token above)",
            )
        block = cache_config_info(client.metrics()).get("block_size")
        if block and block.isdigit() and start <= int(block):
            # Prefix caching hits whole blocks only: below one block nothing can hit, so the
            # warm-up arms nothing and the sweep cannot see the bug (gotcha 33).
            print(
                f"warning: prompts of {start} tokens are within one KV block ({block} tokens): "
                "no prefix-cache hit is possible; use a longer --doc-chars",
                file=sys.stderr,
            )
        plan: list[tuple[int, str]] = []
        units = 0
        unit = choose_pad_unit(count)
        for target in range(start, start + args.count):
            guess = units if plan else target - base
            pad, units = find_pad(count, target, guess, unit)
            plan.append((target, pad))
        if fresh is not None:
            fresh.stop()
        for target, pad in plan:
            if fresh is not None:
                fresh.start(str(target), args.fresh_timeout)
            row = {
                "residue": residue(target),
                "length": target,
                **measure(client, document, pad, max_tokens, extra, args.warmups),
            }
            if fresh is not None:
                fresh.stop()
            if row["prompt_tokens"] is not None and row["prompt_tokens"] != target:
                raise Qwen3090Error(
                    f"the server counted {row['prompt_tokens']} prompt tokens for a prompt "
                    f"/tokenize templated to {target}",
                    fix="the chat template or its kwargs differ between /tokenize and chat",
                )
            rows.append(row)
    finally:
        if fresh is not None:
            fresh.stop()
    summary = verbatim.decide(rows, "residue", args.margin)
    # The bug needs a prefix-cache HIT (gotcha 33): a row whose measured request hit nothing
    # was not armed, and a clean result there is no evidence.
    unarmed = [r["residue"] for r in rows if not r["cached_tokens"]]
    summary["armed"] = not unarmed
    summary["unarmed_residues"] = unarmed
    rows.sort(key=lambda r: int(r["residue"]))
    cols = ["residue", "length", "cached_tokens", "coverage", "prefix", "repeats", "finish"]
    print(report.format_table(rows, [*cols, "flag"]))
    print(
        f"{len(rows)} lengths, median coverage {summary['median_coverage']}; "
        f"flagged residues: {summary['flagged'] or 'none'}"
    )
    if unarmed:
        print(
            f"warning: {len(unarmed)} of {len(rows)} measured requests got no prefix-cache hit "
            "after the warm-up (or the server does not report cached_tokens: it needs "
            "--enable-prompt-tokens-details); those rows cannot show the residue bug",
            file=sys.stderr,
        )
    params = {
        "block_size": block,
        "count": args.count,
        "start": start,
        "warmups": args.warmups,
        "fresh_server": bool(args.fresh_server),
        "doc_chars": len(document),
    }
    report.write_report(args.out, "residues", args, params, rows, summary)
    return 1 if summary["flagged"] else 0
