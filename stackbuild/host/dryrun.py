"""`--dry-run`: a Remote that prints every command instead of changing the host."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from stackbuild.host.ssh import Remote, RemoteResult, quote_argv


@dataclass
class DryRunRemote:
    """Prints every command instead of changing the host.

    Commands that only read (changes=False) go to `reader` when one is given,
    so the printed plan is the one a real run would follow on this host.
    """

    address: str
    reader: Remote | None = None
    echo: Callable[[str], None] = print
    commands: list[str] = field(default_factory=list)
    dry_run: bool = True

    def run(
        self,
        argv: Sequence[str],
        *,
        check: bool = True,
        timeout: float | None = None,
        what: str = "",
        changes: bool = True,
    ) -> RemoteResult:
        cmd = quote_argv(argv)
        self.commands.append(cmd)
        self.echo(f"{'would run' if changes else 'read'}: {cmd}")
        if not changes and self.reader is not None:
            return self.reader.run(argv, check=check, timeout=timeout, what=what, changes=False)
        return RemoteResult(cmd, 0, "", "")

    def put_text(self, text: str, path: str, *, mode: int = 0o644, secret: bool = False) -> None:
        body = "<secret, not shown>" if secret else f"{len(text.encode())} bytes"
        line = f"would put: {path} (mode {mode:04o}, {body})"
        self.commands.append(line)
        self.echo(line)

    def close(self) -> None:
        if self.reader is not None:
            self.reader.close()
