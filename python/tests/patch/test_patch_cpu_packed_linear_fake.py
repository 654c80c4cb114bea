"""Patch tier for ``patches/cpu-packed-linear-fake.patch``.

On a CPU with AMX the CPU build runs small bf16/fp16 linear layers through the SGL kernel:
``convert_weight_packed`` packs the weight once and ``weight_packed_linear`` multiplies. Below
one 16-row tile (N < 16) the packed weight is the float32 transpose, [K, N]. Stock 0.28.0's
fake implementation, which torch.compile traces with, sized the output [M, mat2.size(0)], so
such a layer traced K columns wide. Recorded on an AMX CPU (amx_bf16, amx_int8) serving the
demo models: Qwen3-Next failed at start with ``shape '[s72, 1, 4]' is invalid for input of size
128*s72`` in its in_proj_ba view, and Qwen3.5's compiled graph split 64 columns of b and a
where there were 2 (``CHECK_EQ(A_log.size(0), a.size(1)) failed. 2 vs 64``).

The probe asks the fake for both layouts the kernel takes. On an AMX CPU it also packs real
weights, runs the kernel, and runs one compiled function that splits the output as
Qwen3.5's gated delta net does; elsewhere those parts skip and say why.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.patch

PROBE = r"""
import json, torch
from vllm.platforms.cpu import CpuPlatform
CpuPlatform.import_kernels()
import vllm._custom_ops  # registers the fake implementations
from torch._subclasses.fake_tensor import FakeTensorMode

out = {"amx": bool(torch.cpu._is_amx_tile_supported()),
       "has_op": hasattr(torch.ops._C, "weight_packed_linear"), "layout": [], "kernel": []}
M, K = 3, 128
def fake_shape(x, packed):
    with FakeTensorMode(allow_non_fake_inputs=True) as mode:
        y = torch.ops._C.weight_packed_linear(mode.from_tensor(x), mode.from_tensor(packed),
                                              None, True)
    return list(y.shape), str(y.dtype)
if out["has_op"]:
    x = torch.randn(M, K, dtype=torch.bfloat16)
    # The two layouts convert_weight_packed returns: [K, N] float32 below 16 rows, else [N, K].
    for n in (1, 4, 15, 16, 64):
        packed = (torch.empty(K, n, dtype=torch.float32) if n < 16
                  else torch.empty(n, K, dtype=torch.bfloat16))
        shape, dtype = fake_shape(x, packed)
        out["layout"].append({"n": n, "fake": shape, "dtype": dtype})
if out["has_op"] and out["amx"]:
    torch.manual_seed(0)
    for n in (1, 4, 15, 16, 64):
        w = torch.randn(n, K, dtype=torch.bfloat16)
        x = torch.randn(M, K, dtype=torch.bfloat16)
        packed = torch.ops._C.convert_weight_packed(w)
        y = torch.ops._C.weight_packed_linear(x, packed, None, True)
        ref = x.float() @ w.float().t()
        err = float((y.float() - ref).norm() / ref.norm())
        out["kernel"].append({"n": n, "packed": list(packed.shape),
                              "packed_dtype": str(packed.dtype), "eager": list(y.shape),
                              "fake": fake_shape(x, packed)[0], "rel_err": err})
    # What Qwen3.5's gated delta net does with in_proj_ba's output (two value heads: N = 4).
    w = torch.randn(4, K, dtype=torch.bfloat16)
    packed = torch.ops._C.convert_weight_packed(w)
    def split_ba(x):
        b, a = torch.ops._C.weight_packed_linear(x, packed, None, True).chunk(2, dim=-1)
        return b * 2 + a
    x = torch.randn(M, K, dtype=torch.bfloat16)
    want = split_ba(x)
    try:
        got = torch.compile(split_ba, backend="aot_eager", fullgraph=True)(x)
        out["compiled"] = {"shape": list(got.shape), "want": list(want.shape),
                           "equal": bool(got.shape == want.shape and torch.equal(got, want))}
    except Exception as exc:  # the stock fake's wrong width surfaces here
        out["compiled"] = {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
print("PROBE " + json.dumps(out))
"""


def _probe(tree: Path, run_in_tree: Callable[..., Any]) -> dict[str, Any]:
    proc = run_in_tree(tree, PROBE, timeout=600)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("PROBE ")]
    assert proc.returncode == 0 and lines, proc.stderr[-4000:]
    out: dict[str, Any] = json.loads(lines[-1][len("PROBE "):])
    if not out["has_op"]:
        pytest.skip("this CPU's kernel build has no weight_packed_linear: the patched fake "
                    "is never registered here")
    return out


def test_stock_fake_sizes_a_small_packed_layer_by_its_input_width(
    pristine_cpu_tree: Path, run_in_tree: Callable[..., Any]
) -> None:
    out = _probe(pristine_cpu_tree, run_in_tree)
    by_n = {row["n"]: row["fake"] for row in out["layout"]}
    assert by_n[4] == [3, 128] and by_n[1] == [3, 128], by_n  # K, not N
    assert by_n[16] == [3, 16] and by_n[64] == [3, 64], by_n
    if out["amx"]:
        assert "error" in out["compiled"] or not out["compiled"]["equal"], out["compiled"]


def test_patched_fake_matches_the_kernel_for_both_layouts(
    patched_cpu_tree: Path, run_in_tree: Callable[..., Any]
) -> None:
    out = _probe(patched_cpu_tree, run_in_tree)
    for row in out["layout"]:
        assert row["fake"] == [3, row["n"]] and row["dtype"] == "torch.bfloat16", row
    if not out["amx"]:
        pytest.skip("no AMX here: the SGL kernel path (and the compiled split) runs only on "
                    "CPUs with amx_tile; the fake was checked against both layouts above")
    for row in out["kernel"]:
        # The kernel's own layouts, as the docstring says, and the fake agreeing with it.
        want_packed = [128, row["n"]] if row["n"] < 16 else [row["n"], 128]
        assert row["packed"] == want_packed, row
        assert row["fake"] == row["eager"] == [3, row["n"]], row
        assert row["rel_err"] < 1e-2, row
    assert out["compiled"].get("equal") is True, out["compiled"]
