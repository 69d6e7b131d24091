"""The thin CLI: `main(argv=None) -> int` and one handler mapping errors to exit codes.

Subcommands live in `stackbuild.cli.*` and are imported only when invoked, so
`stackbuild validate` never pays for docker, fabric or aiohttp imports.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import click

from stackbuild import __version__
from stackbuild.errors import EXIT_INFRA, EXIT_INVALID, EXIT_OK, StackbuildError

# name -> (module:attribute, one-line help shown by `stackbuild --help`)
COMMANDS: dict[str, tuple[str, str]] = {
    "list": ("stackbuild.cli.spec:list_cmd", "List the stacks and their variants."),
    "validate": ("stackbuild.cli.spec:validate_cmd", "Check stack specs; errors point into the YAML."),
    "render": ("stackbuild.cli.spec:render_cmd", "Render Dockerfile, systemd units and stack.lock.json."),
    "lock": ("stackbuild.cli.lock:lock_cmd", "Resolve a closure to a hash-pinned lock; audit, check, verify it."),
    "build": ("stackbuild.cli.build:build_cmd", "Build the stack image with BuildKit, smoke-test it, push it."),
    "promote": ("stackbuild.cli.build:promote_cmd", "Point a registry channel tag at an image digest."),
    "deploy": ("stackbuild.cli.deploy:deploy_cmd", "Deploy to a host over SSH, gate it, promote or roll back."),
    "status": ("stackbuild.cli.deploy:status_cmd", "Show what a host runs, which digest, last verdict."),
    "rollback": (
        "stackbuild.cli.deploy:rollback_cmd",
        "Put the previous image back on a host, verified serving.",
    ),
    "gate": ("stackbuild.cli.gate:gate_cmd", "Measure a server against an incumbent and decide."),
    "sim": ("stackbuild.cli.gate:sim_cmd", "Run the SGLang-compatible simulated server."),
    "traffic": ("stackbuild.cli.gate:traffic_cmd",
                "Sample a server's /metrics and write traffic weights per concurrency level."),
    "report": ("stackbuild.cli.report:report_cmd", "Write the results table, conclusion and plot."),
    "demo": ("stackbuild.cli.demo:demo_cmd", "Whole pipeline on the local sim stack and test host."),
}


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in COMMANDS:
            return None
        target, _ = COMMANDS[cmd_name]
        module_name, attr = target.split(":")
        cmd = getattr(importlib.import_module(module_name), attr)
        assert isinstance(cmd, click.Command)
        return cmd

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        with formatter.section("Commands"):
            formatter.write_dl([(name, help_) for name, (_, help_) in COMMANDS.items()])


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="stackbuild")
@click.option(
    "--root",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Project root holding stacks/ (default: nearest parent with stacks/, else the shipped stacks).",
)
@click.pass_context
def cli(ctx: click.Context, root: Path | None) -> None:
    """stackbuild: YAML stack specs -> images and systemd units -> deployed, gated, promoted.

    Exit codes: 0 ok / gate passed, 1 gate failed, 2 invalid input,
    3 gate inconclusive, 4 infrastructure error.
    """
    ctx.obj = {"root": root}


def main(argv: list[str] | None = None) -> int:
    try:
        cli.main(args=argv, prog_name="stackbuild", standalone_mode=False)
    except StackbuildError as err:
        click.echo(f"stackbuild: {err}" if not _is_findings(err) else str(err), err=True)
        return err.exit_code
    except click.exceptions.Exit as ex:
        return int(ex.exit_code)
    except click.Abort:
        click.echo("stackbuild: aborted", err=True)
        return EXIT_INFRA
    except click.ClickException as err:
        err.show()
        return EXIT_INVALID
    except ArithmeticError as err:
        # a computation that could not be carried out (an overflow, a division by zero in
        # the statistics) is not a verdict on the build: never exit 1, never a traceback
        click.echo(f"stackbuild: a computation failed ({type(err).__name__}: {err}): not a "
                   "verdict on the build; report it with the command that gave it", err=True)
        return EXIT_INFRA
    except KeyboardInterrupt:
        click.echo("stackbuild: interrupted", err=True)
        return 130
    except BrokenPipeError:
        return EXIT_OK
    ctx_rc = _LAST_RC.pop() if _LAST_RC else EXIT_OK
    return ctx_rc


# Commands that finish with a non-zero verdict (gate failed: 1, inconclusive: 3)
# without it being an error call `set_exit(code)`.
_LAST_RC: list[int] = []


def set_exit(code: int) -> None:
    _LAST_RC.clear()
    _LAST_RC.append(code)


def _is_findings(err: StackbuildError) -> bool:
    from stackbuild.errors import SpecError

    return isinstance(err, SpecError)


def run() -> None:
    sys.exit(main())


if __name__ == "__main__":
    run()
