"""Spec values are data: any string in a field that reaches a unit or a Dockerfile either fails
validation with a located error or renders to files that parse back to that same value in one
place — never a new key, section, instruction or command.

The unit and Dockerfile readers here are our own small versions of systemd's and BuildKit's
rules (line continuation, sections, quoting, `%` specifiers, `$` expansion), enough to tell
whether a value stayed inside its slot.
"""

from __future__ import annotations

import copy
import re
import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml
from helpers_fuzz import examples
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from stackbuild.errors import SpecError
from stackbuild.render.stack import IDENTITY_ARG, docker_run_argv, image_ref, render_stack
from stackbuild.spec.load import load_stack
from stackbuild.spec.stack import Stack

BASE: dict[str, Any] = {
    "description": "plain",
    "base_image": "local/debian:bookworm",
    "cuda": None,
    "python": "3.11",
    "server": {"engine": "sim", "model_path": "/models/sim", "served_model_name": "sim", "flags": {"--speed": 20}},
    "runtime": {"gpus": "none", "ulimits": {}, "secrets": ["HF_TOKEN"]},
    "host": {"service": "svc"},
    "build": {"apt": ["curl"]},
}
# field path -> (benign value for the baseline)
FIELDS: dict[tuple[Any, ...], str] = {
    ("name",): "plain",
    ("description",): "plain",
    ("host", "service"): "svc",
    ("build", "apt", 0): "curl",
    ("server", "model_path"): "/models/sim",
    ("server", "served_model_name"): "sim",
    ("server", "flags", "--profile"): "baseline",
    ("server", "env", "X"): "1",
    ("base_image",): "local/debian:bookworm",
}
HOSTILE = [
    "x\n[Service]\nExecStartPre=/bin/touch /tmp/pwn",
    "x\nRUN touch /tmp/pwn",
    "../../../../tmp/escape",
    "curl; touch /tmp/pwn",
    "a b",
    "%n%i",
    "$HOME ${X} $$",
    '"; rm -rf / #',
    "trailing\\",
    "x\\\nRUN id",
    ";",
    "'",
    "`id`",
    "a\rb",
    "\x00",
    "\u2028",
    "ok-name",
]


def _set(tree: dict[str, Any], path: tuple[Any, ...], value: str) -> dict[str, Any]:
    out: dict[str, Any] = copy.deepcopy(tree)
    node: Any = out
    for part in path[:-1]:
        node = node.setdefault(part, {})
    node[path[-1]] = value
    return out


def _load(tmp: Path, tree: dict[str, Any]) -> Stack:
    (tmp / "stacks").mkdir(exist_ok=True)
    f = tmp / "stacks" / "s.yaml"
    f.write_text(yaml.safe_dump(tree, allow_unicode=True))
    return load_stack(str(f), root=tmp)


# --- our readers -------------------------------------------------------------------------------


def unit_entries(text: str) -> list[tuple[str, str, str]]:
    """(section, key, value) per entry, with systemd's continuation and comment rules."""
    out: list[tuple[str, str, str]] = []
    section, buf = "", ""
    for raw in text.split("\n"):
        if not buf and raw.lstrip().startswith(("#", ";")):
            continue
        if raw.endswith("\\"):
            buf += raw[:-1] + " "
            continue
        line, buf = (buf + raw).strip(), ""
        if not line:
            continue
        if line.startswith("["):
            section = line
            continue
        key, _, value = line.partition("=")
        out.append((section, key.strip(), value.strip()))
    return out


def _specifiers(s: str) -> str:
    assert re.fullmatch(r"(?:[^%]|%%)*", s), f"a live specifier in {s!r}"
    return s.replace("%%", "%")


def exec_argv(line: str) -> list[str]:
    """ExecStart= words: specifiers, then C-unescaped quoting, then `$$` -> `$` per word."""
    words = []
    for w in shlex.split(_specifiers(line), posix=True):
        if w == IDENTITY_ARG.split()[1]:  # the one variable systemd expands, ours: the server's identity
            words.append(w)
            continue
        assert "$" not in w.replace("$$", ""), f"a live variable in {w!r}"
        words.append(w.replace("$$", "$"))
    return words


def docker_instructions(text: str) -> list[str]:
    out, buf = [], ""
    for raw in text.split("\n"):
        if raw.lstrip().startswith("#"):
            continue
        if raw.endswith("\\"):
            buf += raw[:-1]
            continue
        line, buf = (buf + raw).strip(), ""
        if line:
            out.append(line)
    return out


def docker_labels(instr: str) -> dict[str, str]:
    labels: dict[str, str] = {}
    for m in re.finditer(r'([\w.]+)=("(?:[^"\\]|\\.)*"|\S+)', instr.removeprefix("LABEL ")):
        v = m.group(2)
        labels[m.group(1)] = re.sub(r"\\(.)", r"\1", v[1:-1]) if v.startswith('"') else v
    return labels


# --- the property ------------------------------------------------------------------------------


def _check(tmp: Path, path: tuple[Any, ...], value: str) -> None:
    tree = _set(BASE, path, value)
    base = _load(tmp, _set(BASE, path, FIELDS[path]))
    try:
        stack = _load(tmp, tree)
    except SpecError as err:
        assert err.findings
        for f in err.findings:
            assert f.path.endswith("s.yaml") and f.line >= 1 and f.col >= 1, f
            assert f.severity == "error"
        return
    want, got = render_stack(base), render_stack(stack)
    unit_name = f"units/{stack.host.service}.service"
    assert set(got.files) == {"Dockerfile", "stack.lock.json", unit_name}
    # Unit: same sections and keys as the benign render, values back exactly.
    base_entries, entries = (
        unit_entries(want.files[f"units/{base.host.service}.service"]),
        unit_entries(got.files[unit_name]),
    )
    assert [(s, k) for s, k, _ in entries] == [(s, k) for s, k, _ in base_entries]
    vals = {k: v for _, k, v in entries}
    image = image_ref(stack, got.content_hash)
    assert exec_argv(vals["ExecStart"]) == [*docker_run_argv(
        stack, image=image, port=stack.runtime.port, name=stack.host.service
    ), *IDENTITY_ARG.split()]
    assert _specifiers(vals["Description"]) == f"stackbuild {stack.label} server ({stack.host.service})"
    # Dockerfile: same instructions, labels and apt words back exactly.
    ins, base_ins = docker_instructions(got.files["Dockerfile"]), docker_instructions(want.files["Dockerfile"])
    assert [i.split()[0] for i in ins] == [i.split()[0] for i in base_ins]
    labels = docker_labels(ins[-1])
    assert labels["org.opencontainers.image.description"] == (stack.description or stack.label)
    assert labels["dev.stackbuild.stack"] == stack.name
    apt_run = next(i for i in ins if "apt-get install" in i)
    words = shlex.split(apt_run.split("apt-get install", 1)[1].split("&&")[0])
    assert words[-len(stack.build.apt) :] == list(stack.build.apt)


values = st.one_of(
    st.sampled_from(HOSTILE),
    st.text(max_size=30),
    st.text(alphabet="abc-_.:/=+ %$\\\"'\n;", max_size=20),
    st.from_regex(r"[a-z0-9][a-z0-9.+-]{1,12}", fullmatch=True),
)
PROPERTY = settings(max_examples=examples(400), deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])


@PROPERTY
@given(path=st.sampled_from(sorted(FIELDS)), value=values)
@example(path=("description",), value="x\n[Service]\nExecStartPre=/bin/touch /tmp/pwn")
@example(path=("host", "service"), value="../../../../tmp/escape")
@example(path=("build", "apt", 0), value="curl; touch /tmp/pwn")
@example(path=("server", "model_path"), value="%n $HOME \"'")
def test_any_value_is_rejected_located_or_renders_back(tmp_path: Path, path: tuple[Any, ...], value: str) -> None:
    _check(tmp_path, path, value)


@pytest.mark.parametrize(
    ("path", "value", "needle"),
    [
        (("name",), "x\n[Service]\nExecStartPre=/bin/touch /tmp/pwn", "control character"),
        (("host", "service"), "../../../../tmp/escape", "not an identifier"),
        (("build", "apt", 0), "curl; touch /tmp/pwn", "not a Debian package name"),
        (("description",), "a\x1b[31mred", "control character"),
    ],
)
def test_hostile_values_fail_at_their_line(tmp_path: Path, path: tuple[Any, ...], value: str, needle: str) -> None:
    tree = _set(BASE, path, value)
    with pytest.raises(SpecError) as err:
        _load(tmp_path, tree)
    text = (tmp_path / "stacks" / "s.yaml").read_text().split("\n")
    (f,) = err.value.findings
    assert needle in f.message
    line = text[f.line - 1]
    assert str(path[-1] if isinstance(path[-1], str) else path[-2]) in line or line.lstrip().startswith("-")


# --- the gateway: its fields reach its unit (smg's argv), its Dockerfile, its pool file --------------

BASE_GW: dict[str, Any] = {
    **BASE,
    "server": {**BASE["server"], "flags": {"--speed": 20, "--enable-metrics": True}},
    "gateway": {"host": "gpu-a", "listen": "127.0.0.1", "service": "gw", "base_image": "local/debian:bookworm",
                "health": {"endpoint": "/health"}},
}
GW_FIELDS: dict[tuple[Any, ...], str] = {
    ("gateway", "host"): "gpu-a",
    ("gateway", "listen"): "127.0.0.1",
    ("gateway", "service"): "gw",
    ("gateway", "base_image"): "local/debian:bookworm",
    ("gateway", "health", "endpoint"): "/health",
    ("gateway", "version"): "1.13.0",
}


def _check_gateway(tmp: Path, path: tuple[Any, ...], value: str) -> None:
    from stackbuild.host.ssh import parse_host
    from stackbuild.render.gateway import POOL_VAR, docker_argv, pool_file, render_gateway, worker_url

    base = _load(tmp, _set(BASE_GW, path, GW_FIELDS[path]))
    try:
        stack = _load(tmp, _set(BASE_GW, path, value))
    except SpecError as err:
        assert err.findings and all(f.path.endswith("s.yaml") and f.line >= 1 and f.col >= 1 for f in err.findings)
        return
    gw = stack.gateway
    assert gw is not None
    # the host: an SSH target as ssh reads it, and the worker URL built on it one word with no quote
    assert str(parse_host(gw.host or "")).split("@")[-1].split(":")[0] in (gw.host or "")
    url = worker_url(gw.host or "", 31000, None)
    assert re.fullmatch(r"http://[^\s\"'$`\\]+:31000", url), url
    got, want = render_gateway(stack), render_gateway(base)
    unit = f"units/{gw.service}.service"
    assert set(got.files) == {"gateway/Dockerfile", "gateway/requirements.lock", "gateway/smg_launch.py", unit,
                              f"units/{gw.service}.workers"}
    base_unit = next(text for rel, text in want.files.items() if rel.endswith(".service"))
    entries, base_entries = unit_entries(got.files[unit]), unit_entries(base_unit)
    assert [(s, k) for s, k, _ in entries] == [(s, k) for s, k, _ in base_entries]
    vals = {k: v for _, k, v in entries}
    assert vals["EnvironmentFile"] == f"-{pool_file(gw)}"
    # every word back exactly; the one variable systemd expands is the pool's, left so on purpose
    words = shlex.split(_specifiers(vals["ExecStart"]), posix=True)
    live = [w for w in words if "$" in w.replace("$$", "")]
    assert live == [f"${POOL_VAR}"], live
    image = words[words.index(f"dev.stackbuild.unit={gw.service}") + 1]
    assert [w.replace("$$", "$") for w in words] == docker_argv(gw, image=image, workers=[f"${POOL_VAR}"])
    assert _specifiers(vals["Description"]) == f"stackbuild gateway for {stack.name} ({gw.service})"
    ins, base_ins = docker_instructions(got.files["gateway/Dockerfile"]), docker_instructions(
        want.files["gateway/Dockerfile"])
    assert [i.split()[0] for i in ins] == [i.split()[0] for i in base_ins]
    assert ins[0] == f"FROM {gw.base_image}"
    labels = docker_labels(next(i for i in ins if i.startswith("LABEL")))
    assert labels["org.opencontainers.image.base.name"] == gw.base_image
    assert labels["dev.stackbuild.gateway"] == gw.version


@PROPERTY
@given(path=st.sampled_from(sorted(GW_FIELDS)), value=values)
@example(path=("gateway", "host"), value="gpu a; touch /tmp/pwn")
@example(path=("gateway", "service"), value="../../../../tmp/escape")
@example(path=("gateway", "health", "endpoint"), value="/health\nExecStartPre=/bin/touch /tmp/pwn")
@example(path=("gateway", "base_image"), value="debian:bookworm\nRUN touch /tmp/pwn")
def test_any_gateway_value_is_rejected_located_or_renders_back(tmp_path: Path, path: tuple[Any, ...],
                                                               value: str) -> None:
    _check_gateway(tmp_path, path, value)
