"""tests/support/sass_loops.py on SASS shaped like cuobjdump's: which loop is the steady state."""

from __future__ import annotations

import pytest

from tests.support.sass_loops import mma_loops, parse_sass

pytestmark = pytest.mark.unit


def _sass(lines: list[tuple[int, str]]) -> str:
    head = "\tcode for sm_90a\n\t\tFunction : kernel\n"
    return head + "".join(f"        /*{addr:04x}*/                   {text} ;"
                          f"                 /* 0x000000000000000000 */\n"
                          for addr, text in lines)


# A prologue, a main loop (0x0040-0x00c0) with a spin-wait loop inside it (0x0080-0x0090),
# a masked tail loop (0x00d0-0x0130), EXIT, and a retry stub after EXIT that jumps back into
# the tail loop (what ptxas emits for mbarrier waits): counted, it would be a third loop.
KERNEL = _sass([
    (0x0000, "S2R R0, SR_TID.X"),
    (0x0010, "IMAD R1, R0, 0x4, RZ"),
    (0x0020, "LDG.E R2, desc[UR4][R2.64]"),
    (0x0030, "MOV R3, RZ"),
    (0x0040, "LDGSTS.E.BYPASS.128 [R4], desc[UR4][R6.64]"),
    (0x0050, "HGMMA.64x32x16.F32.BF16 R24, gdesc[UR8], RZ, !UPT"),
    (0x0060, "FMUL R8, R8, R9"),
    (0x0070, "MUFU.EX2 R10, R8"),
    (0x0080, "SYNCS.PHASECHK.TRANS64.TRYWAIT P1, [UR4+0x10], R2"),
    (0x0090, "@!P1 BRA 0x80"),
    (0x00a0, "IADD3 R3, R3, 0x1, RZ"),
    (0x00b0, "ISETP.GE.AND P0, PT, R3, R5, PT"),
    (0x00c0, "@!P0 BRA 0x40"),
    (0x00d0, "LDGSTS.E.BYPASS.128 [R4], desc[UR4][R6.64]"),
    (0x00e0, "HGMMA.64x32x16.F32.BF16 R24, gdesc[UR8], R24"),
    (0x00f0, "FSEL R8, R8, -INF, P2"),
    (0x0100, "FMUL R8, R8, R9"),
    (0x0110, "IADD3 R3, R3, 0x1, RZ"),
    (0x0120, "ISETP.GE.AND P0, PT, R3, R7, PT"),
    (0x0130, "@!P0 BRA 0xd0"),
    (0x0140, "STG.E desc[UR4][R2.64], R24"),
    (0x0150, "EXIT"),
    (0x0160, "SYNCS.PHASECHK.TRANS64.TRYWAIT P1, [UR4+0x20], R2"),
    (0x0170, "@!P1 BRA 0x160"),
    (0x0180, "BRA 0xe0"),
])


def test_the_steady_state_loops_are_the_innermost_holding_an_mma() -> None:
    found = mma_loops(KERNEL)
    assert [(loop.start, loop.end) for loop in found] == [(0x40, 0xC0), (0xD0, 0x130)]
    main, tail = found
    assert main.instructions == 9 and tail.instructions == 7
    assert main.guarded == 0 and tail.guarded == 0
    assert main.mma == 1 and main.opcodes["HGMMA"] == 1 and main.opcodes["BRA"] == 2
    classes = main.classes()
    assert classes["copy"] == 1 and classes["mma"] == 1 and classes["softmax"] == 2
    assert sum(classes.values()) == main.instructions


def test_a_loop_inside_an_mma_loop_makes_the_inner_one_the_steady_state() -> None:
    # Nest the main loop in an outer loop (0x0000-0x0140): the outer one is not innermost.
    outer = KERNEL.replace("/*0140*/                   STG.E desc[UR4][R2.64], R24",
                           "/*0140*/                   @P3 BRA 0x0")
    found = mma_loops(outer)
    assert [(loop.start, loop.end) for loop in found] == [(0x40, 0xC0), (0xD0, 0x130)]


# One loop (0x0010-0x0090) with a mask block that a predicated forward branch jumps over
# (0x0040-0x0050), and a predicated branch out of the loop to a retry stub after EXIT.
GUARDED = _sass([
    (0x0000, "MOV R3, RZ"),
    (0x0010, "HGMMA.64x32x16.F32.BF16 R24, gdesc[UR8], RZ, !UPT"),
    (0x0020, "ISETP.GE.AND P2, PT, R3, R5, PT"),
    (0x0030, "@!P2 BRA 0x60"),
    (0x0040, "FSEL R8, R8, -INF, P2"),
    (0x0050, "FSEL R9, R9, -INF, P2"),
    (0x0060, "FMUL R8, R8, R9"),
    (0x0070, "@!P1 BRA 0xb0"),
    (0x0080, "IADD3 R3, R3, 0x1, RZ"),
    (0x0090, "@!P0 BRA 0x10"),
    (0x00a0, "EXIT"),
    (0x00b0, "BRA 0x80"),
])


def test_a_block_a_forward_branch_skips_is_counted_as_guarded() -> None:
    (loop,) = mma_loops(GUARDED)
    assert (loop.start, loop.end, loop.instructions) == (0x10, 0x90, 9)
    # The two FSELs; not what the branch out of the loop passes over.
    assert loop.guarded == 2
    # The same jump made unconditional is an always-taken skip, not a guard.
    assert mma_loops(GUARDED.replace("@!P2 BRA 0x60", "BRA 0x60"))[0].guarded == 0
    assert parse_sass(GUARDED)[3].predicated and not parse_sass(GUARDED)[0].predicated


def test_sass_without_an_mma_loop_or_exit_is_refused() -> None:
    no_mma = KERNEL.replace("HGMMA.64x32x16.F32.BF16", "FFMA")
    with pytest.raises(ValueError, match="no loop of the SASS holds an MMA"):
        mma_loops(no_mma)
    with pytest.raises(ValueError, match="no EXIT"):
        mma_loops(KERNEL.replace("EXIT", "NOP"))
    with pytest.raises(ValueError, match="no SASS instruction"):
        parse_sass("Fatbin elf code:\n")
