"""``qwen3090 prepare STEP DIR``: derive files from a checkpoint, resumably, with a manifest."""

from __future__ import annotations

import argparse
from pathlib import Path


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from qwen3090.prepare.draft_vocab import DEFAULT_TOP, VOCAB_FILE
    from qwen3090.prepare.record import MANIFEST_NAME

    p = subparsers.add_parser(
        "prepare",
        help="prepare a checkpoint: the MTP draft vocabulary, the -fast variant (resumable, "
        "checksummed)",
        description="Derive files from a model directory. Each step skips itself when its "
        f"outputs exist with the sha256 recorded in DIR/{MANIFEST_NAME} for the same inputs, "
        "and records them there (`qwen3090 check model DIR` reads it). Steps: draft-vocab, "
        "fast-variant.",
    )
    steps = p.add_subparsers(dest="step", required=True, metavar="STEP")
    dv = steps.add_parser(
        "draft-vocab",
        help=f"count the model's own outputs into DIR/{VOCAB_FILE} (gotcha 11)",
        description="Generate with the model through vLLM over a prompt set, count the output "
        f"token ids and save the TOP most frequent as DIR/{VOCAB_FILE} (int64, most frequent "
        "first); the mtp-draft-vocab patch makes the MTP head draft only from them. Prints "
        "in-sample and held-out coverage.",
    )
    dv.add_argument("dir", type=Path, metavar="DIR", help="the model directory (written into)")
    dv.add_argument(
        "--top", type=int, default=DEFAULT_TOP,
        help="ids to keep (default %(default)s: where coverage stops growing on the 27B, "
        "gotcha 11; capped by the vocabulary and by the ids seen)",
    )
    dv.add_argument("--prompts", type=Path, help="a file with one prompt per line "
                    "(default: a built-in set of 40 mixed prompts)")
    dv.add_argument("--max-tokens", type=int, default=512, help="per prompt (default %(default)s)")
    dv.add_argument("--temperature", type=float, default=0.0,
                    help="sampling temperature (default %(default)s: greedy)")
    dv.add_argument("--seed", type=int, default=0, help="sampling seed (default %(default)s)")
    dv.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                    help="cpu: the CPU build of vLLM, e.g. on a demo model (default %(default)s)")
    dv.add_argument("--max-model-len", type=int, default=4096,
                    help="vLLM --max-model-len for the pass (default %(default)s)")
    dv.add_argument("--force", action="store_true", help="rerun even when the step is current")
    dv.set_defaults(func=run_draft_vocab)

    fv = steps.add_parser(
        "fast-variant",
        help="the -fast checkpoint from the W4A16 base: lm_head and MTP head requantized "
        "(gotcha 41)",
        description="Write BASE-fast (or --out): the base with its bf16 lm_head and MTP linear "
        "weights requantized in the base's own AutoRound/GPTQ format (bits, group size) and "
        "marked quantized in quantization_config.extra_config, so vLLM 0.28.0 loads them as "
        "they are; the embeddings stay bf16 (vLLM loads no quantized Qwen3.5 embedding). "
        "Rewritten shards, config.json and the index are new files, every other file a "
        "relative symlink into BASE, which is not written to. Resumes shard by shard; "
        f"records the outputs' sha256 in OUT/{MANIFEST_NAME}.",
    )
    fv.add_argument("base", type=Path, metavar="BASE", help="the base checkpoint (read only)")
    fv.add_argument("--out", type=Path,
                    help="the variant's directory (default: BASE-fast beside BASE)")
    fv.add_argument("--no-mtp", action="store_true",
                    help="requantize the lm_head only, leave the MTP head bf16")
    fv.add_argument("--force", action="store_true", help="rerun even when the step is current")
    fv.set_defaults(func=run_fast_variant)


def _bad_flag(flag: str, value: object, why: str) -> Exception:
    from qwen3090.errors import Qwen3090Error

    return Qwen3090Error(f"{flag} {value}: {why}",
                         fix=f"pass a valid {flag} to `qwen3090 prepare draft-vocab`")


def run_draft_vocab(args: argparse.Namespace) -> int:
    from qwen3090.errors import Qwen3090Error
    from qwen3090.modelcheck import check_model_dir
    from qwen3090.patchtool import sha256_file
    from qwen3090.prepare import draft_vocab as dv
    from qwen3090.prepare import record
    from qwen3090.prepare.prompts import BUILTIN_PROMPTS, read_prompt_file

    if args.top < 1:
        raise _bad_flag("--top", args.top, "must be at least 1")
    if args.max_tokens < 1:
        raise _bad_flag("--max-tokens", args.max_tokens, "must be at least 1")
    model: Path = args.dir
    # The manifest's own state is this command's to repair, not a reason to refuse.
    problems = check_model_dir(model, "target", args.device, prepared=False)
    if problems:
        raise Qwen3090Error("cannot prepare:\n  " + "\n  ".join(problems),
                            fix=f"repair {model} (`qwen3090 check model {model}`), then rerun")
    prompts = read_prompt_file(args.prompts) if args.prompts else list(BUILTIN_PROMPTS)
    vocab_size = dv.config_vocab_size(model)
    inputs = {
        "model": record.model_fingerprint(model),
        "prompts": record.inputs_digest({"prompts": prompts}),
        "top": min(args.top, vocab_size),
        "max_tokens": args.max_tokens,
        "temperature": args.temperature,
        "seed": args.seed,
        "max_model_len": args.max_model_len,
    }
    log = dv.stderr_log
    if not args.force and record.is_current(model, dv.STEP, inputs):
        log(f"draft-vocab: skipped, {dv.VOCAB_FILE} is current ({record.MANIFEST_NAME})")
        return 0
    outputs = dv.generate(
        model, prompts, max_tokens=args.max_tokens, temperature=args.temperature,
        seed=args.seed, device=args.device, max_model_len=args.max_model_len, log=log,
    )
    result = dv.build_vocab(outputs, args.top, vocab_size)
    out = model / dv.VOCAB_FILE
    dv.write_vocab(out, result.ids)
    held = ("n/a" if result.holdout_coverage is None
            else f"{100 * result.holdout_coverage:.2f}%")
    report = {
        "ids": len(result.ids),
        "vocab_size": vocab_size,
        "generated_tokens": result.generated_tokens,
        "distinct_tokens": result.distinct_tokens,
        "coverage": round(result.coverage, 6),
        "holdout_coverage": (None if result.holdout_coverage is None
                             else round(result.holdout_coverage, 6)),
        "prompts": len(prompts),
    }
    record.record_step(model, record.StepRecord(
        step=dv.STEP, inputs=inputs, outputs={dv.VOCAB_FILE: sha256_file(out)},
        report=report,
    ))
    print(
        f"draft-vocab: wrote {out}: {len(result.ids)} ids of {vocab_size} "
        f"({result.distinct_tokens} distinct in {result.generated_tokens} generated tokens); "
        f"coverage {100 * result.coverage:.2f}% in-sample, {held} held out"
    )
    return 0


def run_fast_variant(args: argparse.Namespace) -> int:
    from qwen3090.errors import Qwen3090Error
    from qwen3090.modelcheck import check_model_dir
    from qwen3090.prepare import fast_variant as fv
    from qwen3090.prepare import record

    base: Path = args.base
    problems = check_model_dir(base, "target", prepared=False)
    if problems:
        raise Qwen3090Error("cannot prepare:\n  " + "\n  ".join(problems),
                            fix=f"repair {base} (`qwen3090 check model {base}`), then rerun")
    out: Path = args.out or fv.default_out(base)
    plan = fv.plan(base, out, mtp=not args.no_mtp)
    inputs = fv.inputs_of(plan, record.model_fingerprint(base))
    log = fv.stderr_log
    if not args.force and out.is_dir() and record.is_current(out, fv.STEP, inputs):
        log(f"fast-variant: skipped, {out} is current ({record.MANIFEST_NAME})")
        return 0
    outputs, report = fv.build(plan, inputs, log)
    record.record_step(out, record.StepRecord(step=fv.STEP, inputs=inputs, outputs=outputs,
                                              report=report))
    mib = 1 << 20
    parts = [
        f"{group} {report[f'{group}_bytes_before'] / mib:.1f} -> "
        f"{report[f'{group}_bytes_after'] / mib:.1f} MiB"
        for group in ("lm_head", "mtp") if report[f"{group}_bytes_before"]
    ]
    worst = max(f["relative_error"] for f in report["tensors"].values())
    print(f"fast-variant: wrote {out}: {len(plan.targets)} tensor(s) requantized to "
          f"int{plan.fmt.bits} g{plan.fmt.group_size} ({'; '.join(parts)}; worst relative "
          f"error {worst:.4f}), {report['linked']} file(s) linked from {base}")
    return 0
