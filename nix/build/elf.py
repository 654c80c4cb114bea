"""A small ELF reader: the dynamic-section facts auto-patchelf looks at (stdlib only).

Only what nixpkgs' auto-patchelf.py reads is decoded: the machine, the OS ABI, whether the file
is a static executable or has no segments, PT_INTERP, DT_NEEDED and DT_RUNPATH/DT_RPATH.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

ELF_MAGIC = b"\x7fELF"
PT_DYNAMIC = 2
PT_INTERP = 3
PT_LOAD = 1
DT_NULL = 0
DT_NEEDED = 1
DT_STRTAB = 5
DT_RPATH = 15
DT_RUNPATH = 29
ET_EXEC = 2


class NotElf(Exception):
    """The file is not an ELF object this reader understands (auto-patchelf skips those)."""


@dataclass(frozen=True)
class ElfInfo:
    machine: int
    osabi: int
    is_static_executable: bool
    has_segments: bool
    interpreter: str | None
    needed: tuple[str, ...]
    runpath: tuple[str, ...]


def _vaddr_to_offset(loads: list[tuple[int, int, int]], vaddr: int) -> int:
    for p_offset, p_vaddr, p_filesz in loads:
        if p_vaddr <= vaddr < p_vaddr + p_filesz:
            return p_offset + vaddr - p_vaddr
    raise NotElf(f"address {vaddr:#x} is in no loaded segment")


def read_elf(path: Path) -> ElfInfo:
    with path.open("rb") as f:
        return read_elf_stream(f, str(path))


def read_elf_stream(f: BinaryIO, name: str) -> ElfInfo:
    """``read_elf`` on an open, seekable binary stream (``name`` is for messages)."""
    if True:
        ident = f.read(16)
        if len(ident) < 16 or ident[:4] != ELF_MAGIC:
            raise NotElf(name)
        if ident[4] != 2 or ident[5] != 1:
            # 32-bit or big-endian: not x86_64, and auto-patchelf skips other architectures.
            return ElfInfo(0, ident[7], False, True, None, (), ())
        osabi = ident[7]
        header = f.read(48)
        if len(header) < 48:
            raise NotElf(name)
        (e_type, e_machine, _v, _entry, e_phoff, _shoff, _flags, _ehsize, e_phentsize,
         e_phnum, _shentsize, _shnum, _shstrndx) = struct.unpack("<HHIQQQIHHHHHH", header)
        f.seek(e_phoff)
        table = f.read(e_phentsize * e_phnum)
        loads: list[tuple[int, int, int]] = []
        dynamic: tuple[int, int] | None = None
        interp: tuple[int, int] | None = None
        for i in range(e_phnum):
            entry = table[i * e_phentsize : i * e_phentsize + 56]
            if len(entry) < 56:
                raise NotElf(name)
            p_type, _pflags, p_offset, p_vaddr, _paddr, p_filesz, _memsz, _align = struct.unpack(
                "<IIQQQQQQ", entry
            )
            if p_type == PT_LOAD:
                loads.append((p_offset, p_vaddr, p_filesz))
            elif p_type == PT_DYNAMIC:
                dynamic = (p_offset, p_filesz)
            elif p_type == PT_INTERP:
                interp = (p_offset, p_filesz)
        interpreter = None
        if interp is not None:
            f.seek(interp[0])
            interpreter = f.read(interp[1]).split(b"\0", 1)[0].decode()
        needed_offsets: list[int] = []
        runpath_offset: int | None = None
        rpath_offset: int | None = None
        strtab: int | None = None
        if dynamic is not None:
            f.seek(dynamic[0])
            raw = f.read(dynamic[1])
            for pos in range(0, len(raw) - 15, 16):
                tag, value = struct.unpack_from("<qQ", raw, pos)
                if tag == DT_NULL:
                    break
                if tag == DT_NEEDED:
                    needed_offsets.append(value)
                elif tag == DT_RUNPATH:
                    runpath_offset = value
                elif tag == DT_RPATH:
                    rpath_offset = value
                elif tag == DT_STRTAB:
                    strtab = value

        def string(offset: int) -> str:
            assert strtab is not None
            f.seek(_vaddr_to_offset(loads, strtab) + offset)
            out = b""
            while b"\0" not in out:
                chunk = f.read(256)
                if not chunk:
                    break
                out += chunk
            return out.split(b"\0", 1)[0].decode()

        needed: tuple[str, ...] = ()
        runpath: tuple[str, ...] = ()
        if strtab is not None:
            needed = tuple(string(o) for o in needed_offsets)
            # auto-patchelf reads DT_RUNPATH and falls back to DT_RPATH.
            chosen = runpath_offset if runpath_offset is not None else rpath_offset
            if chosen is not None:
                runpath = tuple(string(chosen).split(":"))
        return ElfInfo(
            machine=e_machine,
            osabi=osabi,
            is_static_executable=e_type == ET_EXEC and interpreter is None,
            has_segments=e_phnum > 0,
            interpreter=interpreter,
            needed=needed,
            runpath=runpath,
        )
