"""The binary audit on small ELF and fatbin fixtures built here with cc and objcopy."""

from __future__ import annotations

import shutil
import struct
import subprocess
import zipfile
from pathlib import Path

import pytest

from stackbuild.spec.lock import audit, elf

MAGIC = 0xBA55ED50


def entry(kind: int, arch: int, payload: bytes = b"\0" * 24) -> bytes:
    """One fatbin entry: a 64-byte header (kind, arch at offset 28) then its payload."""
    head = struct.pack("<HHIQIIHHI", kind, 0x0101, 64, len(payload), 0, 0, 0, 0, arch)
    return head + b"\0" * (64 - len(head)) + payload


def container(*entries: bytes) -> bytes:
    body = b"".join(entries)
    return struct.pack("<IHHQ", MAGIC, 1, 16, len(body)) + body


def test_fatbin_containers_give_sass_and_ptx_arches() -> None:
    blob = container(entry(2, 120), entry(1, 90)) + b"\0" * 8 + container(entry(2, 100))
    code = elf.parse_fatbin(blob)
    assert (code.sass, code.ptx) == ({100, 120}, {90})


def test_fatbin_magic_with_a_foreign_header_is_skipped() -> None:
    fake = struct.pack("<IHHQ", MAGIC, 7, 16, 64) + b"\0" * 64  # version 7: not a fatbin header
    code = elf.parse_fatbin(fake + container(entry(2, 89)))
    assert (code.sass, code.ptx) == ({89}, set())


def test_truncated_fatbin_stops_without_error() -> None:
    blob = container(entry(2, 120), entry(1, 120))[:-40]
    assert elf.parse_fatbin(blob).sass == {120}


def _cc() -> str:
    cc = shutil.which("cc") or shutil.which("gcc")
    if not cc or not shutil.which("objcopy"):
        pytest.skip("needs a C compiler and objcopy (apt: gcc binutils)")
    return cc


def _so(tmp: Path, name: str, soname: str, needs: list[Path], fatbin: bytes | None = None) -> Path:
    src = tmp / f"{name}.c"
    src.write_text(f"int {name.replace('.', '_').replace('-', '_')}(void) {{ return 1; }}\n")
    out = tmp / name
    argv = [_cc(), "-shared", "-fPIC", "-o", str(out), str(src), f"-Wl,-soname,{soname}", f"-L{tmp}"]
    argv += ["-Wl,--no-as-needed", *(f"-l:{n.name}" for n in needs)]
    subprocess.run(argv, check=True, capture_output=True)
    if fatbin is not None:
        blob = tmp / f"{name}.fatbin"
        blob.write_bytes(fatbin)
        subprocess.run(["objcopy", "--add-section", f".nv_fatbin={blob}", str(out)], check=True)
    return out


def _wheel(tmp: Path, files: dict[str, Path]) -> Path:
    whl = tmp / "demo-1.0-cp312-cp312-manylinux_2_28_x86_64.whl"
    with zipfile.ZipFile(whl, "w") as z:
        for arc, p in files.items():
            z.write(p, arc)
        z.writestr("demo-1.0.dist-info/METADATA", "Metadata-Version: 2.1\nName: demo\nVersion: 1.0\n")
    return whl


def test_audit_reads_needed_sonames_and_fatbin_arches(tmp_path: Path) -> None:
    cudart = _so(tmp_path, "libcudart.so.12", "libcudart.so.12", [])
    kern = _so(tmp_path, "kern.so", "kern.so", [cudart], container(entry(2, 90), entry(2, 120), entry(1, 90)))
    whl = _wheel(tmp_path, {"demo/lib/libcudart.so.12": cudart, "demo/_C.so": kern})
    a = audit.audit_wheel(whl, "ab" * 32)
    assert (a.shared_objects, a.cuda_links, a.provides) == (2, {"libcudart.so.12": 12}, ["libcudart.so.12"])
    assert (a.sass, a.ptx) == ([90, 120], [90])
    assert audit.covers(a, 120) and audit.covers(a, 121)  # sm_121 runs sm_120 SASS


def test_audit_of_a_wheel_without_gpu_code(tmp_path: Path) -> None:
    plain = _so(tmp_path, "plain.so", "plain.so", [])
    a = audit.audit_wheel(_wheel(tmp_path, {"demo/plain.so": plain, "demo/x.py": tmp_path / "plain.so.c"}), "cd" * 32)
    assert (a.shared_objects, a.cuda_links, a.sass, a.ptx) == (1, {}, [], [])


@pytest.mark.parametrize(
    ("sass", "ptx", "target", "ok"),
    [
        ([120], [], 120, True),
        ([90, 100], [], 120, False),  # 'no kernel image is available'
        ([90], [90], 120, True),  # JIT from compute_90
        ([100], [], 103, True),  # same major, earlier minor
        ([103], [], 100, False),  # SASS for a later minor does not run
        ([], [], 120, True),  # no GPU code at all: nothing to launch
    ],
)
def test_covers(sass: list[int], ptx: list[int], target: int, ok: bool) -> None:
    assert audit.covers(audit.WheelAudit("w", "0" * 64, sass=sass, ptx=ptx), target) is ok


def test_cuda_link_majors_come_from_cuda_numbered_libraries_only() -> None:
    assert [audit.cuda_link(n) for n in ("libcudart.so.13", "libcublasLt.so.12", "libcufft.so.11")] == [13, 12, None]
    assert audit.cuda_link("libcudart-d0da41ae.so.12") == 12  # auditwheel's renamed copy


def test_audit_cache_round_trips_by_sha256(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STACKBUILD_CACHE_DIR", str(tmp_path))
    a = audit.WheelAudit("w.whl", "e" * 64, 3, {"libcudart.so.13": 13}, [120], [], ["libcudart.so.13"])
    calls: list[int] = []

    def fetch() -> Path:
        calls.append(1)
        raise AssertionError("a cached audit must not fetch")

    audit.store(a)
    assert audit.audit_cached("e" * 64, "w.whl", fetch) == a
    assert calls == []
    assert audit.load_committed(_write(tmp_path / "x.json", audit.dump_committed({"w": a}))) == {"w": a}


def _write(p: Path, text: str) -> Path:
    p.write_text(text)
    return p
