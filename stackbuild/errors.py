"""Error types and the exit codes they map to (the CLI contract in the design).

Every expected failure is one of these; the CLI's single handler prints the
message (never a traceback) and exits with the class's code.
"""

from __future__ import annotations

from dataclasses import dataclass

EXIT_OK = 0
EXIT_GATE_FAILED = 1
EXIT_INVALID = 2
EXIT_INCONCLUSIVE = 3
EXIT_INFRA = 4


class StackbuildError(Exception):
    """Base class: `str(err)` is the whole message the user sees."""

    exit_code = EXIT_INFRA


class InputError(StackbuildError):
    """Bad input: usage, spec, flags, files. Exit 2."""

    exit_code = EXIT_INVALID


@dataclass(frozen=True)
class Finding:
    """One problem in a spec, compiler style: `path:line:col: severity: message [rule]`."""

    path: str
    line: int
    col: int
    severity: str  # "error" | "warning"
    message: str
    rule: str

    def __str__(self) -> str:
        # one line per finding, whatever the message quotes back from the input
        message = " ".join(self.message.split())
        return f"{self.path}:{self.line}:{self.col}: {self.severity}: {message} [{self.rule}]"


class SpecError(InputError):
    """One or more findings of severity error (warnings ride along)."""

    def __init__(self, findings: list[Finding]) -> None:
        self.findings = findings
        super().__init__("\n".join(str(f) for f in findings))


class GateFailed(StackbuildError):
    exit_code = EXIT_GATE_FAILED


class GateInconclusive(StackbuildError):
    exit_code = EXIT_INCONCLUSIVE


class InfraError(StackbuildError):
    """Docker, SSH, registry, HTTP, timeouts. Shows the command, exit code and output tail."""

    exit_code = EXIT_INFRA

    def __init__(
        self,
        message: str,
        *,
        command: str | None = None,
        returncode: int | None = None,
        output: str = "",
        log_path: str | None = None,
    ) -> None:
        self.command = command
        self.returncode = returncode
        self.output = output
        self.log_path = log_path
        super().__init__(message)

    def __str__(self) -> str:
        parts = [self.args[0]]
        if self.command:
            rc = f" (exit {self.returncode})" if self.returncode is not None else ""
            parts.append(f"  command: {self.command}{rc}")
        if self.output:
            tail = "\n".join(self.output.rstrip().splitlines()[-15:])
            parts.append("  output tail:\n" + "\n".join("    " + ln for ln in tail.splitlines()))
        if self.log_path:
            parts.append(f"  full log: {self.log_path}")
        return "\n".join(parts)
