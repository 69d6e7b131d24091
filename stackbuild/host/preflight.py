"""Preflight: everything the host must offer before anything on it is touched.

Every check runs and the report lists each failure, so one run tells the
whole story. Reads only. Parsers of the tools' output are pure functions.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from stackbuild.errors import InfraError
from stackbuild.host import pcie
from stackbuild.host.ssh import Remote, sh_argv
from stackbuild.host.units import image_id_argv
from stackbuild.spec.lock.check import nccl_of, read_lock
from stackbuild.spec.rules import driver_floor
from stackbuild.spec.stack import Stack

# What preflight sends (testing/fake_host.py interprets these very constants).
DOCKER_INFO = ["docker", "info", "--format", "{{.ServerVersion}}|{{.DockerRootDir}}|{{json .Runtimes}}"]
NVIDIA_SMI_QUERY = [
    "nvidia-smi",
    "--query-gpu=index,name,compute_cap,driver_version,memory.total",
    "--format=csv,noheader,nounits",
]
CDI_SCRIPT = "ls /etc/cdi /var/run/cdi 2>/dev/null | grep -i nvidia"
LIMITS_SCRIPT = 'p=$(pidof dockerd) && cat "/proc/${p%% *}/limits"'  # the daemon's own hard limits
TCP_SCRIPT = "cat /proc/net/tcp /proc/net/tcp6 2>/dev/null"  # the host's socket table (listening ports)

# Free disk a candidate's image needs under the docker root when the host lacks it: a CUDA stack's
# layers (torch, the CUDA libraries, flashinfer's kernels) unpack to tens of GiB; the CPU-only
# simulator's to well under one.
GPU_IMAGE_KIB = 64 * 2**20
CPU_IMAGE_KIB = 1 * 2**20


def df_argv(path: str) -> list[str]:
    return ["df", "-Pk", path]


def need_free_kib(stack: Stack) -> int:
    return CPU_IMAGE_KIB if stack.runtime.gpus == "none" else GPU_IMAGE_KIB


@dataclass(frozen=True)
class Gpu:
    index: int
    name: str
    arch: str  # sm_120
    driver: str
    memory_mib: int


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str


@dataclass(frozen=True)
class PreflightReport:
    checks: tuple[Check, ...]
    gpus: tuple[Gpu, ...] = ()
    facts: tuple[tuple[str, str], ...] = ()  # what else preflight read of the host (PCIe, the image's NCCL)

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)

    @property
    def failures(self) -> tuple[Check, ...]:
        return tuple(c for c in self.checks if not c.ok)

    def host_facts(self) -> dict[str, str]:
        if not self.gpus:
            return {}
        return {
            "gpu_model": self.gpus[0].name,
            "gpu_count": str(len(self.gpus)),
            "driver": self.gpus[0].driver,
            "arch": self.gpus[0].arch,
            **dict(self.facts),
        }


class PreflightFailed(InfraError):
    def __init__(self, address: str, report: PreflightReport) -> None:
        self.report = report
        n = len(report.failures)
        lines = [
            f"preflight failed on {address} ({n} problem{'s' if n > 1 else ''}): "
            + "; ".join(f"{c.name}: {c.detail}" for c in report.failures)
        ]
        lines += [f"  - {c.name}: {c.detail}" for c in report.failures] if n > 1 else []
        super().__init__("\n".join(lines))


def parse_nvidia_smi(text: str) -> list[Gpu]:
    gpus = []
    for line in text.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) < 5:
            continue
        idx, name, cap, driver, mem = parts[:5]
        arch = "sm_" + cap.replace(".", "") if re.fullmatch(r"\d+\.\d+", cap) else cap
        gpus.append(Gpu(int(idx), name, arch, driver, int(float(mem)) if mem.strip() else 0))
    return gpus


def parse_listening_ports(proc_net_tcp: str) -> set[int]:
    """TCP ports in LISTEN state from /proc/net/tcp{,6} text."""
    ports = set()
    for line in proc_net_tcp.splitlines():
        f = line.split()
        if len(f) > 3 and f[3] == "0A" and ":" in f[1]:
            ports.add(int(f[1].rsplit(":", 1)[1], 16))
    return ports


def parse_df_avail_kib(text: str) -> int | None:
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    if len(lines) < 2:
        return None
    f = lines[-1].split()
    return int(f[3]) if len(f) > 3 and f[3].isdigit() else None


def version_tuple(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", v)[:3])


def check_gpus(stack: Stack, gpus: list[Gpu], smi_error: str | None) -> list[Check]:
    if smi_error is not None:
        return [Check("gpus", False, f"nvidia-smi failed: {smi_error}; install the NVIDIA driver")]
    need = stack.runtime.gpu_count or stack.runtime.tp
    out = [
        Check(
            "gpu count",
            len(gpus) >= need,
            f"{len(gpus)} GPU(s), the stack needs {need} (tp={stack.runtime.tp})",
        )
    ]
    if stack.arches and gpus:
        bad = sorted({g.arch for g in gpus if g.arch not in stack.arches})
        out.append(
            Check(
                "gpu arch",
                not bad,
                f"host has {', '.join(sorted({g.arch for g in gpus}))}; stack is built for "
                f"{', '.join(stack.arches)}" + (f" ({', '.join(bad)} not covered: add it to arches)" if bad else ""),
            )
        )
    floor = driver_floor(stack.cuda)
    if floor and gpus:
        drv = gpus[0].driver
        out.append(
            Check(
                "driver",
                version_tuple(drv)[:1] >= (floor,),
                f"driver {drv}, CUDA {stack.cuda} needs >= {floor}",
            )
        )
    return out


def run_preflight(
    remote: Remote,
    stack: Stack,
    *,
    image: str,
    ports: dict[int, bool],
) -> PreflightReport:
    """Run every check for a deploy of `image` binding `ports` (port -> may our own incumbent hold it)."""
    docker, root_dir, runtimes = _docker(remote)
    checks: list[Check] = [docker]
    gpus: list[Gpu] = []
    facts: dict[str, str] = {}
    if stack.runtime.gpus != "none":
        found, gpus, facts = _gpus(remote, stack, runtimes)
        checks += found
    checks.append(_disk(remote, image, root_dir, need_free_kib(stack)))
    if stack.runtime.ulimits:
        limits = remote.run(
            sh_argv(LIMITS_SCRIPT),
            check=False,
            what="the docker daemon's limits",
            changes=False,
        )
        # not visible (daemon in another namespace): docker itself will say at start
        checks += ulimit_checks(limits.stdout, dict(stack.runtime.ulimits)) if limits.ok else []
    tcp = remote.run(sh_argv(TCP_SCRIPT), check=False, what="listening ports", changes=False)
    checks += port_checks(parse_listening_ports(tcp.stdout), ports)
    return PreflightReport(tuple(checks), tuple(gpus), tuple(sorted(facts.items())))


def _docker(remote: Remote) -> tuple[Check, str, str]:
    """Is docker usable: its check, the daemon's root dir and its runtimes (as `docker info` says)."""
    docker = remote.run(DOCKER_INFO, check=False, what="docker info", changes=False)
    if docker.ok and "|" in docker.stdout:
        version, root_dir, runtimes = [*docker.stdout.strip().split("|", 2), "", ""][:3]
        return Check("docker", True, f"docker {version}"), root_dir, runtimes
    return Check("docker", False, f"docker is not usable: {_one_line(docker)}; install/start it"), "/var/lib/docker", ""


def _gpus(remote: Remote, stack: Stack, runtimes: str) -> tuple[list[Check], list[Gpu], dict[str, str]]:
    """The NVIDIA runtime, the GPUs (count, arch, driver) and, with TP > 1 on several GPUs, the PCIe path."""
    checks: list[Check] = []
    facts: dict[str, str] = {}
    cdi = remote.run(
        sh_argv(CDI_SCRIPT),
        check=False,
        what="look for NVIDIA CDI specs",
        changes=False,
    )
    has = '"nvidia"' in runtimes or cdi.ok
    checks.append(
        Check(
            "nvidia runtime",
            has,
            "NVIDIA container runtime or CDI spec found"
            if has
            else "neither the nvidia docker runtime nor an NVIDIA CDI spec: install nvidia-container-toolkit",
        )
    )
    smi = remote.run(NVIDIA_SMI_QUERY, check=False, what="nvidia-smi", changes=False)
    gpus = parse_nvidia_smi(smi.stdout) if smi.ok else []
    checks += check_gpus(stack, gpus, None if smi.ok else _one_line(smi))
    if len(gpus) > 1 and stack.runtime.tp > 1:
        found = _pcie(remote, stack)
        checks += found[0]
        facts.update(found[1])
    return checks, gpus, facts


def _disk(remote: Remote, image: str, root_dir: str, need_kib: int) -> Check:
    """Room for the image under the daemon's root dir, unless it is there already."""
    present = remote.run(
        image_id_argv(image),
        check=False,
        what="is the image already there",
        changes=False,
    )
    if present.ok:
        return Check("disk", True, "image already on the host")
    df = remote.run(df_argv(root_dir), check=False, what="free disk", changes=False)
    avail = parse_df_avail_kib(df.stdout) if df.ok else None
    if avail is None and "No such file" in df.stderr:
        # The daemon's storage is not on this shell's filesystem (docker socket
        # shared into a container host): nothing here can measure it.
        return Check(
            "disk",
            True,
            f"{root_dir} not visible from the host shell (remote daemon storage): free space not checked",
        )
    return Check(
        "disk",
        avail is not None and avail >= need_kib,
        f"{_gib(avail)} free under {root_dir}, the image needs {_gib(need_kib)}"
        if avail is not None
        else f"cannot read free space of {root_dir}: {_one_line(df)}",
    )


def _pcie(remote: Remote, stack: Stack) -> tuple[list[Check], dict[str, str]]:
    """P2P per GPU pair, ACS and IOMMU (host/pcie.py), and the NCCL the image carries (its lock's pin)."""
    topo = remote.run(pcie.TOPO_P2P_READ, check=False, what="nvidia-smi topo -p2p r", changes=False)
    pairs = pcie.parse_p2p(topo.stdout) if topo.ok else {}
    found = pcie.parse_pcie(remote.run(sh_argv(pcie.PCIE_SCRIPT), check=False, what="PCIe ACS and IOMMU",
                                       changes=False).stdout)
    facts = pcie.facts(pairs, found, stack.runtime.tp)
    lock = read_lock(stack)
    if lock is not None and (nccl := nccl_of(lock)):
        facts["nccl"] = f"{nccl[0]} {nccl[1]}"
    return [Check(c.name, c.ok, c.detail) for c in pcie.checks(stack, pairs, found)], facts


# docker --ulimit names -> the row of /proc/PID/limits that bounds them
_LIMIT_ROWS = {
    "nofile": "Max open files",
    "memlock": "Max locked memory",
    "stack": "Max stack size",
    "nproc": "Max processes",
    "core": "Max core file size",
}


def _limit_value(v: str) -> float:
    return float("inf") if v in ("-1", "unlimited") else float(v)


def ulimit_checks(proc_limits: str, ulimits: dict[str, str | int]) -> list[Check]:
    """Spec ulimits above the docker daemon's hard limits make `docker run` exit 125.

    An unprivileged daemon (or one in a container) cannot raise its children
    above its own hard limit, so the container would never start.
    """
    hard: dict[str, float] = {}
    for line in proc_limits.splitlines():
        for name, row in _LIMIT_ROWS.items():
            if line.startswith(row):
                fields = line[len(row) :].split()
                if len(fields) >= 2:
                    hard[name] = _limit_value(fields[1])
    out = []
    for name, value in ulimits.items():
        if name not in hard:
            continue
        want = max(_limit_value(part) for part in str(value).split(":"))
        limit = hard[name]
        shown = "unlimited" if limit == float("inf") else f"{limit:.0f}"
        out.append(
            Check(
                f"ulimit {name}",
                want <= limit,
                f"runtime.ulimits {name}={value}, the docker daemon's hard limit is {shown}"
                + ("" if want <= limit else ": lower it in the spec or raise the daemon's"),
            )
        )
    return out


def port_checks(listening: set[int], ports: dict[int, bool]) -> list[Check]:
    """Each port the deploy will bind must be free, or held by the incumbent it replaces.

    A port held by a stranger would make readiness probe the stranger.
    """
    out = []
    for port, incumbent_ok in ports.items():
        busy = port in listening
        if not busy:
            detail = f"port {port} is free"
        elif incumbent_ok:
            detail = f"port {port} is held by the incumbent (replaced on promotion)"
        else:
            detail = f"port {port} is in use by another process: free it or change runtime.port"
        out.append(Check("port", not busy or incumbent_ok, detail))
    return out


def _gib(kib: int | None) -> str:
    return "?" if kib is None else f"{kib / 1024 / 1024:.1f} GiB"


def _one_line(res: object) -> str:
    text = (getattr(res, "stderr", "") or getattr(res, "stdout", "")).strip()
    return text.splitlines()[-1][:200] if text else f"exit {getattr(res, 'returncode', '?')}"
