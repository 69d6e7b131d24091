"""The fat binary container's little-endian headers, read by hand (no payload is decompressed).

Standard library only: the smoke test runs this module's source inside a built
image (python -c) to read the AOT kernels there, where pyelftools is not installed.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass, field

MAGIC = 0xBA55ED50
_MAGIC_BYTES = struct.pack("<I", MAGIC)
_HDR = struct.Struct("<IHHQ")
_ENTRY = struct.Struct("<HHIQIIHHI")
KIND_PTX, KIND_SASS = 1, 2


@dataclass
class GpuCode:
    sass: set[int] = field(default_factory=set)  # arch numbers with SASS (120 = sm_120)
    ptx: set[int] = field(default_factory=set)  # arch numbers with PTX (JIT-able on >= that arch)

    def merge(self, other: GpuCode) -> None:
        self.sass |= other.sass
        self.ptx |= other.ptx


def parse_fatbin(buf: bytes | mmap.mmap, start: int = 0, end: int | None = None) -> GpuCode:
    """Every container in buf[start:end]; a truncated or foreign tail stops the walk, not the audit."""
    end = len(buf) if end is None else end
    code = GpuCode()
    pos = buf.find(_MAGIC_BYTES, start, end)
    while pos >= 0 and pos + _HDR.size <= end:
        _, version, hsize, fat_size = _HDR.unpack_from(buf, pos)
        if version != 1 or hsize != _HDR.size:
            pos = buf.find(_MAGIC_BYTES, pos + 1, end)
            continue
        stop = min(pos + hsize + fat_size, end)
        e = pos + hsize
        while e + _ENTRY.size <= stop:
            kind, _, ehsize, payload, _, _, _, _, arch = _ENTRY.unpack_from(buf, e)
            if ehsize < _ENTRY.size or ehsize > 4096 or kind not in (KIND_PTX, KIND_SASS, 4):
                break
            if kind == KIND_PTX:
                code.ptx.add(arch)
            elif kind == KIND_SASS:
                code.sass.add(arch)
            e += ehsize + payload
        pos = buf.find(_MAGIC_BYTES, max(stop, pos + 1), end)
    return code
