"""Start smg with its keys read from files and the environment, never from the command line.

Runs inside the gateway image as `python3 smg_launch.py --control-plane-key-env NAME
[--data-plane-key NAME ...] -- launch ARGS...`, each NAME a variable of its environment: the
unit hands the 0600 key and secrets files to `docker run --env-file`, which the docker client
reads on the host (a bind mount would be resolved by the daemon, which need not share the
host's files). smg 1.13.0 takes its control-plane keys (`--control-plane-api-keys
id:name:role:key`) and its serving-path keys (`--tenant-api-key tenant:key`) only as arguments
(router_args.py reads no variable for them); arguments are in the unit file and in
/proc/PID/cmdline for any user of the host. Here they are added to the argument list inside
this process and handed to smg's own entry point (smg.cli.main parses the list it is given;
`smg launch` runs the Rust core in this same process), after the variables are taken out of the
environment smg and its children see: the keys stay in their files, the container's
environment and this process's memory. A missing or empty key stops the start with one line
and exit 2.
"""

from __future__ import annotations

import os
import sys

USAGE = "usage: smg_launch.py --control-plane-key-env NAME [--data-plane-key NAME ...] -- launch ARGS..."


def fail(message: str) -> None:
    print(f"smg_launch: {message}", file=sys.stderr)
    raise SystemExit(2)


def parse(argv: list[str]) -> tuple[str, list[str], list[str]]:
    key_var, names = "", []
    while argv and argv[0] != "--":
        opt = argv.pop(0)
        if not argv:
            fail(USAGE)
        if opt == "--control-plane-key-env":
            key_var = argv.pop(0)
        elif opt == "--data-plane-key":
            names.append(argv.pop(0))
        else:
            fail(f"unknown option {opt}; {USAGE}")
    if not key_var or not argv:
        fail(USAGE)
    return key_var, names, argv[1:]


def main() -> None:
    key_var, names, rest = parse(sys.argv[1:])
    key = os.environ.pop(key_var, "").strip()
    if not key or any(c in key for c in " \t\n:"):
        fail(f"no usable control-plane key in {key_var}: remove the gateway's key file on its host and redeploy")
    extra = ["--control-plane-api-keys", f"stackbuild:stackbuild:admin:{key}"]
    for name in names:
        value = os.environ.pop(name, "")  # out of the environment smg and its children see
        if not value:
            fail(f"the data-plane key {name} (gateway.api_keys) is not set in the gateway's secrets file")
        extra += ["--tenant-api-key", f"{name.lower()}:{value}"]
    from smg.cli import main as smg_main

    smg_main([*rest, *extra])


if __name__ == "__main__":
    main()
