"""Read what a shared object links (ELF DT_NEEDED) and which GPU code it carries (`.nv_fatbin`).

ELF goes through pyelftools. The fat binary container is read by hand from its
little-endian headers (stackbuild.spec.lock.fatbin; no payload is decompressed):

    container: u32 magic 0xBA55ED50 | u16 version | u16 header size (16) | u64 size of the entries
    entry:     u16 kind (1 PTX, 2 ELF/SASS) | u16 | u32 entry header size | u64 payload size
               | u32 | u32 | u16 minor | u16 major | u32 arch (e.g. 120 for sm_120) | ...

An entry's payload follows its header; the next entry follows the payload.
Containers sit back to back in the section, sometimes padded, so the next one
is found by its magic (and accepted only with version 1 and a 16-byte header).
Most libraries keep them in `.nv_fatbin`; some embed them as plain large data
(libcufft.so.11 of nvidia-cufft-cu12 11.3.3.83: a 400-byte `.nv_fatbin` and
23,531 containers in `.ldata`), so the large-data sections are read too.
"""

from __future__ import annotations

import mmap
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from elftools.common.exceptions import ELFError
from elftools.elf.dynamic import DynamicSection
from elftools.elf.elffile import ELFFile

from stackbuild.spec.lock.fatbin import GpuCode as GpuCode  # re-exported: the audit's callers read it from here
from stackbuild.spec.lock.fatbin import parse_fatbin as parse_fatbin

FATBIN_SECTIONS = (".nv_fatbin", ".ldata", ".lrodata")


@dataclass
class ElfFacts:
    needed: list[str]
    soname: str | None
    gpu: GpuCode


def read_elf(f: BinaryIO) -> ElfFacts | None:
    """None when f is not an ELF file."""
    try:
        elf = ELFFile(f)
    except ELFError:
        return None
    needed: list[str] = []
    soname = None
    gpu = GpuCode()
    for sec in elf.iter_sections():
        if isinstance(sec, DynamicSection):
            for tag in sec.iter_tags():
                if tag.entry.d_tag == "DT_NEEDED":
                    needed.append(str(getattr(tag, "needed", "")))
                elif tag.entry.d_tag == "DT_SONAME":
                    soname = str(getattr(tag, "soname", ""))
        elif sec.name in FATBIN_SECTIONS and sec["sh_type"] != "SHT_NOBITS":
            off, size = sec["sh_offset"], sec["sh_size"]
            f.seek(0)
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
                gpu.merge(parse_fatbin(m, off, off + size))
    return ElfFacts(needed, soname, gpu)


def read_elf_path(path: Path) -> ElfFacts | None:
    with path.open("rb") as f:
        return read_elf(f)
