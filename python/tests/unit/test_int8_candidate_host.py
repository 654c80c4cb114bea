"""The host side of benchmarks/int8_ws_candidate.py (issue 21), on the CPU: how verify lengths
map to consumer warpgroups, the TMA descriptors over an int8_per_token_head cache, and the
PTX of the fp16 widening run instruction by instruction. A device call is scarce; a wrong
split, descriptor or constant found here costs none of it."""

from __future__ import annotations

import ast
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

from tests.support.modules import load_module

pytestmark = pytest.mark.unit

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "int8_ws_candidate.py"


@pytest.fixture(scope="module")
def cand() -> ModuleType:
    pytest.importorskip("triton.experimental.gluon")
    return load_module(SCRIPT, "int8_ws_candidate_host")


@pytest.mark.parametrize(("q", "group", "want"), [
    (1, 6, (1, 1)), (8, 6, (1, 8)), (10, 6, (1, 10)),  # up to 64 rows: one warpgroup
    (11, 6, (2, 6)), (16, 6, (2, 8)),  # tokens split evenly over two
    (16, 4, (1, 16)), (32, 4, (2, 16)),
])
def test_verify_lengths_map_to_warpgroups_of_at_most_64_rows(
    cand: ModuleType, q: int, group: int, want: tuple[int, int]
) -> None:
    num_wg, wg_q = cand.warpgroups(q, group)
    assert (num_wg, wg_q) == want
    assert wg_q * group <= 64 and num_wg * wg_q >= q


def test_more_than_two_warpgroups_of_rows_is_refused(cand: ModuleType) -> None:
    with pytest.raises(ValueError, match="q x G <= 128 rows"):
        cand.warpgroups(22, 6)


def test_descriptors_span_every_token_row_of_the_cache(cand: ModuleType) -> None:
    torch = pytest.importorskip("torch")
    blocks, block, kv_heads, head = 5, 16, 4, 256
    padded = head + 4  # each row: K codes, K scale, V codes, V scale
    buf = torch.zeros(blocks, block, kv_heads, 2 * padded, dtype=torch.int8)
    desc, kt_desc, sc_desc, rows_per_block, s_head = cand.descriptors(buf[..., :padded], 16)
    row_bytes = kv_heads * 2 * padded
    # Every token row of every block, the last block's slots included.
    for d in (desc, kt_desc, sc_desc):
        assert list(d.shape) == [blocks * block, row_bytes]
        assert list(d.strides) == [row_bytes, 1]
    # 128-byte code chunks, K's 32-byte tail (a Q.K k-step), 16-byte V tails and scales.
    assert [list(d.block_shape) for d in (desc, kt_desc, sc_desc)] == [[16, 128], [16, 32],
                                                                       [16, 16]]
    # The kernel's K column is head * s_head; its V column s_head / 2 further.
    assert (rows_per_block, s_head) == (block, 2 * padded)


def test_a_cache_that_is_not_per_token_head_is_refused(cand: ModuleType) -> None:
    torch = pytest.importorskip("torch")
    plain = torch.zeros(5, 16, 4, 256, dtype=torch.int8)  # K alone, no scales beside it
    with pytest.raises(ValueError, match="not an int8_per_token_head cache"):
        cand.descriptors(plain, 16)


def _widen_asm() -> str:
    """The PTX string _widen hands to inline_asm_elementwise (its fp16 path)."""
    tree = ast.parse(SCRIPT.read_text())
    fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "_widen")
    call = next(n for n in ast.walk(fn) if isinstance(n, ast.Call)
                and isinstance(n.func, ast.Attribute) and n.func.attr == "inline_asm_elementwise")
    first = call.args[0]
    assert isinstance(first, ast.Constant) and isinstance(first.value, str)
    return first.value


def _run_widen(asm: str, word: int) -> list[float]:
    """The asm's instructions, one by one, on one 32-bit register of four int8 codes (code k
    in byte k, as pack=4 packs them): the four fp16 values of $0 (codes 0, 1) and $1 (2, 3)."""
    regs: dict[str, int] = {"$2": word}
    for ins in (part.strip() for part in asm.strip("{} ").split(";")):
        if not ins or ins.startswith(".reg"):
            continue
        op, rest = ins.split(None, 1)
        dst, *srcs = [a.strip() for a in rest.split(",")]
        vals = [int(a, 16) if a.startswith("0x") else regs[a] for a in srcs]
        if op == "xor.b32":
            regs[dst] = vals[0] ^ vals[1]
        elif op == "mov.b32":
            regs[dst] = vals[0]
        elif op == "prmt.b32":
            a, b, sel = vals
            pool = a.to_bytes(4, "little") + b.to_bytes(4, "little")
            nibbles = [(sel >> (4 * i)) & 0xF for i in range(4)]
            assert all(n < 8 for n in nibbles), "sign-replicating selectors are not modelled"
            regs[dst] = int.from_bytes(bytes(pool[n] for n in nibbles), "little")
        elif op == "sub.f16x2":
            x = np.frombuffer(vals[0].to_bytes(4, "little"), dtype=np.float16)
            y = np.frombuffer(vals[1].to_bytes(4, "little"), dtype=np.float16)
            regs[dst] = int.from_bytes((x - y).astype(np.float16).tobytes(), "little")
        else:
            raise AssertionError(f"an instruction the model does not know: {ins}")
    halves = regs["$0"].to_bytes(4, "little") + regs["$1"].to_bytes(4, "little")
    return [float(v) for v in np.frombuffer(halves, dtype=np.float16)]


def test_the_fp16_widening_turns_every_int8_code_into_its_value() -> None:
    """_widen's fp16 path (the 1024 bias): its PTX, run instruction by instruction, gives
    every int8 code exactly, in every lane of the packed register."""
    asm = _widen_asm()
    for base in range(-128, 128):
        codes = [((base + 64 * k + 128) % 256) - 128 for k in range(4)]
        word = int.from_bytes(bytes(c & 0xFF for c in codes), "little")
        assert _run_widen(asm, word) == [float(c) for c in codes], (codes, asm)
