"""The loops of a kernel's SASS (``cuobjdump -sass`` text) and the instructions each issues.

A loop is a backward branch: its body is every instruction from the branch's target to the
branch. Branches placed after the function's last ``EXIT`` are left out: that is where ptxas
puts the retry stubs of mbarrier waits, which jump back into a loop from outside it. The
steady state of an attention kernel is the innermost loop holding an MMA (one holding no
other such loop); a Triton split pass has two, the unmasked one and the masked tail, and a
warp-specialised kernel one per consumer partition.

A loop's count is static: a block inside it that a predicated forward branch can jump over
(a causal mask built only on the last tiles, say) counts although most trips skip it. Such
blocks are counted apart as the loop's ``guarded`` instructions, so a reader knows when the
count is exact (none) and when it is an upper bound.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass

# Tensor-core instructions of sm_80 / sm_90: warp MMAs and warpgroup MMAs (bf16/fp16, fp8,
# int8).
MMA_OPCODES = frozenset({"HMMA", "IMMA", "HGMMA", "QGMMA", "IGMMA"})

# Opcode classes for the budget tables, by the opcode alone (an IMAD may add an address or
# scale a value: the classes are a coarse reading, the opcodes themselves are exact).
OPCODE_CLASSES: dict[str, frozenset[str]] = {
    "copy": frozenset({"LDGSTS", "LDG", "LDGDEPBAR", "DEPBAR", "UTMALDG", "UBLKCP"}),
    "shared": frozenset({"LDS", "STS", "LDSM", "STSM"}),
    "mma": MMA_OPCODES | {"WARPGROUP", "WARPSYNC"},
    "integer": frozenset({"IMAD", "LEA", "SHF", "IADD3", "VIADD", "MOV", "ISETP", "SEL",
                          "IABS", "IMNMX", "VIMNMX", "R2UR", "S2R", "S2UR", "LDC", "ULDC",
                          "UIADD3", "UMOV", "ULEA", "USHF", "UIMAD", "USEL", "UISETP", "ULOP3",
                          "USGXT", "P2R", "R2P", "PLOP3", "CS2R"}),
    "convert": frozenset({"PRMT", "LOP3", "HADD2", "HFMA2", "HMUL2", "I2F", "I2FP", "F2F",
                          "F2FP", "F2I", "I2I"}),
    "softmax": frozenset({"FMUL", "FADD", "FFMA", "MUFU", "FMNMX", "FSEL", "FSETP", "SHFL"}),
}

_INSTRUCTION = re.compile(
    r"^\s*/\*(?P<addr>[0-9a-f]{4,})\*/\s+(?P<pred>@!?U?P[T\d]+\s+)?(?P<op>[A-Z][A-Z0-9_.]*)"
    r"(?P<rest>[^;]*);")
_TARGET = re.compile(r"0x([0-9a-f]+)")


@dataclass(frozen=True)
class Instruction:
    addr: int
    opcode: str  # without its modifiers: "HGMMA" for "HGMMA.64x64x16.F32.BF16"
    text: str
    predicated: bool = False


@dataclass(frozen=True)
class Loop:
    start: int
    end: int  # the backward branch's address
    opcodes: Counter[str]
    # Instructions a predicated forward branch inside the loop can skip (its target also
    # inside the loop): counted in opcodes, but not run on every trip.
    guarded: int = 0

    @property
    def instructions(self) -> int:
        return sum(self.opcodes.values())

    @property
    def mma(self) -> int:
        return sum(n for op, n in self.opcodes.items() if op in MMA_OPCODES)

    def classes(self) -> dict[str, int]:
        """Instructions by OPCODE_CLASSES, the rest under "other"."""
        out = dict.fromkeys([*OPCODE_CLASSES, "other"], 0)
        for op, n in self.opcodes.items():
            name = next((c for c, ops in OPCODE_CLASSES.items() if op in ops), "other")
            out[name] += n
        return out

    def contains(self, other: Loop) -> bool:
        return self != other and self.start <= other.start and other.end <= self.end


def parse_sass(text: str) -> list[Instruction]:
    """The instructions of one function's SASS, in address order."""
    out = []
    for line in text.splitlines():
        m = _INSTRUCTION.match(line)
        if m:
            out.append(Instruction(int(m["addr"], 16), m["op"].split(".")[0],
                                   m["op"] + m["rest"], predicated=m["pred"] is not None))
    if not out:
        raise ValueError("no SASS instruction found: is this cuobjdump -sass output?")
    return out


def loops(instructions: list[Instruction]) -> list[Loop]:
    """Every backward branch before the last EXIT, as the loop it closes."""
    exits = [i.addr for i in instructions if i.opcode == "EXIT"]
    if not exits:
        raise ValueError("the SASS has no EXIT: not one whole function")
    last_exit = max(exits)
    found = []
    for ins in instructions:
        if ins.opcode != "BRA" or ins.addr > last_exit:
            continue
        target = _TARGET.search(ins.text)
        if target is None or int(target.group(1), 16) >= ins.addr:
            continue
        start = int(target.group(1), 16)
        inside = [i for i in instructions if start <= i.addr <= ins.addr]
        found.append(Loop(start, ins.addr, Counter(i.opcode for i in inside),
                          len(_guarded(inside, ins.addr))))
    return found


def _guarded(inside: list[Instruction], end: int) -> set[int]:
    """Addresses a predicated forward branch among ``inside`` can jump over, its target at or
    before the loop's last instruction (branches out of the loop, to mbarrier retry stubs or
    the exit, leave the loop's trips as they are)."""
    skipped: set[int] = set()
    for ins in inside:
        if ins.opcode != "BRA" or not ins.predicated:
            continue
        target = _TARGET.search(ins.text)
        if target is None:
            continue
        to = int(target.group(1), 16)
        if ins.addr < to <= end:
            skipped.update(i.addr for i in inside if ins.addr < i.addr < to)
    return skipped


def mma_loops(text: str) -> list[Loop]:
    """The innermost loops holding an MMA, in address order."""
    with_mma = [loop for loop in loops(parse_sass(text)) if loop.mma]
    inner = [a for a in with_mma if not any(a.contains(b) for b in with_mma)]
    if not inner:
        raise ValueError("no loop of the SASS holds an MMA instruction")
    return sorted(inner, key=lambda loop: loop.start)
