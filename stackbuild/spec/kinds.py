"""Kinds of spec values: what each string may contain, checked once at the spec boundary.

A spec value ends up in a systemd unit, a Dockerfile, an image tag, a host path
or an argv. Escaping at render time keeps a value from becoming code there;
these kinds keep values from being surprising in the first place (a service
name that walks out of /etc/systemd/system, a label that opens a unit section,
an apt "package" that is a shell command). Each kind is a pydantic-annotated
`str`, so a bad value is reported with the file:line:col of the YAML node.
"""

from __future__ import annotations

import re
import unicodedata
from typing import Annotated

from pydantic import AfterValidator


def control_chars(s: str) -> list[str]:
    """The control / separator characters in `s` that no single-line spec value may hold."""
    return sorted({c for c in s if unicodedata.category(c) in ("Cc", "Cf", "Zl", "Zp", "Cs", "Co", "Cn")})


def _kind(pattern: str, what: str, *, max_len: int = 200) -> AfterValidator:
    rx = re.compile(pattern)

    def check(v: str) -> str:
        if bad := control_chars(v):
            raise ValueError(f"control character(s) {''.join(bad)!r} not allowed; write {what}")
        if len(v) > max_len:
            raise ValueError(f"longer than {max_len} characters; write {what}")
        if not rx.fullmatch(v):
            raise ValueError(f"not {what}")
        return v

    return AfterValidator(check)


def _text(v: str) -> str:
    if bad := control_chars(v):
        raise ValueError(f"control character(s) {''.join(bad)!r} not allowed; keep it to one line of text")
    if len(v) > 1000:
        raise ValueError("longer than 1000 characters; shorten it")
    return v


def _abs_path(v: str) -> str:
    if bad := control_chars(v):
        raise ValueError(f"control character(s) {''.join(bad)!r} not allowed in a path")
    if not re.fullmatch(r"/[A-Za-z0-9._/+-]*", v) or any(p in ("..", ".") for p in v.split("/")):
        raise ValueError("not an absolute, normalised path of letters, digits and ._+-/ (no '..')")
    return v


# A systemd unit name stem and a docker tag component at once: no '/', no '..', no '@' (templates).
Ident = Annotated[
    str, _kind(r"[A-Za-z0-9](?:[A-Za-z0-9_-]|\.(?!\.)){0,62}", "an identifier: letters, digits, _-. (max 63, no '..')")
]
# One line of free text (descriptions, model names): anything printable.
Text = Annotated[str, AfterValidator(_text)]
# A Debian package name, optionally pinned: NAME[=VERSION] per Debian policy 5.6.1/5.6.12.
AptPackage = Annotated[
    str,
    _kind(r"[a-z0-9][a-z0-9+.-]+(?:=[A-Za-z0-9.+~:-]+)?", "a Debian package name like 'libnuma1' or 'curl=7.88.1-10'"),
]
# PEP 440-ish version as pip takes it after '=='.
Version = Annotated[str, _kind(r"[A-Za-z0-9][A-Za-z0-9.+!_-]*", "a version like '2.9.1' or '2.9.1+cu130'")]
PyVersion = Annotated[str, _kind(r"3\.\d{1,2}", "a Python version like '3.12'")]
CudaVersion = Annotated[str, _kind(r"\d{1,2}\.\d{1,2}(?:\.\d{1,3})?", "a CUDA version like '13.0.1'")]
Url = Annotated[str, _kind(r"https?://[A-Za-z0-9._~:/?#\[\]@!&'()*+,;=%-]+", "an http(s) URL", max_len=500)]
GitRef = Annotated[str, _kind(r"[A-Za-z0-9._/+-]+", "a git branch, tag or commit")]
ImageRef = Annotated[
    str,
    _kind(
        r"[a-z0-9][a-z0-9._/:@-]*(?::[A-Za-z0-9_][A-Za-z0-9_.-]*)?",
        "an image reference like 'nvidia/cuda:13.0.1-devel-ubuntu24.04'",
        max_len=500,
    ),
]
# Docker registry repository: HOST[:PORT]/PATH.
Registry = Annotated[
    str, _kind(r"[A-Za-z0-9.-]+(?::\d{1,5})?/[a-z0-9._/-]+", "a registry repository like '127.0.0.1:5000/stackbuild'")
]
EnvName = Annotated[str, _kind(r"[A-Za-z_][A-Za-z0-9_]*", "an environment variable name (letters, digits, _)")]
LONG_FLAG = re.compile(r"--[A-Za-z0-9][A-Za-z0-9_-]*")
# An SSH target as `ssh` and stackbuild.host.ssh.parse_host take it: [USER@]HOST[:PORT], HOST a name, an
# address, an ~/.ssh/config alias or a bracketed IPv6 address.
SSH_TARGET = re.compile(
    r"^(?:(?P<user>[A-Za-z0-9._][A-Za-z0-9._-]*)@)?"
    r"(?:\[(?P<v6>[0-9A-Fa-f:.]+)\]|(?P<host>[A-Za-z0-9._-]+))"
    r"(?::(?P<port>[0-9]{1,5}))?$"
)


def _ssh_target(v: str) -> str:
    if bad := control_chars(v):
        raise ValueError(f"control character(s) {''.join(bad)!r} not allowed; write [USER@]HOST[:PORT]")
    m = SSH_TARGET.match(v)
    if not m or len(v) > 300:
        raise ValueError("not [USER@]HOST[:PORT] (e.g. root@gpu1:22, or an ~/.ssh/config alias)")
    if m["port"] and not 1 <= int(m["port"]) <= 65535:
        raise ValueError(f"port {m['port']} is out of range 1-65535")
    return v


SshTarget = Annotated[str, AfterValidator(_ssh_target)]
Size = Annotated[str, _kind(r"\d+[bkmgBKMG]?", "a size like '32g'")]
# Where a server prints a log line: "<distribution> <version> <path in it>:<line>".
SourceLine = Annotated[
    str,
    _kind(r"[A-Za-z0-9][A-Za-z0-9._-]* [A-Za-z0-9][A-Za-z0-9.+!_-]* [A-Za-z0-9_./-]+\.py:\d+(?:-\d+)?",
          "where the line is printed, like 'sglang 0.5.23 srt/layers/flashinfer_comm_fusion.py:580'"),
]
AbsPath = Annotated[str, AfterValidator(_abs_path)]
