"""Run inside a built image: every installed version is the locked one, torch carries the locked CUDA.

usage: python verify_image.py REQUIREMENTS.LOCK TORCH_CUDA_PREFIX
Needs no GPU. Prints one line per problem and exits 1 if there is any.
"""

import importlib.metadata as md
import re
import sys


def canon(name):
    return re.sub(r"[-_.]+", "-", name).lower()


def locked(text):
    pins = {}
    for line in text.splitlines():
        m = re.match(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;\\]+)", line)
        if m:
            pins[canon(m.group(1))] = m.group(2)
        m = re.match(r"^# built from source in the image.*: (.+)$", line)
        if m and m.group(1).strip() != "none":
            for item in m.group(1).split(", "):
                name, _, version = item.partition("==")
                pins[canon(name)] = version
    return pins


def main(lock_file, cuda_prefix):
    with open(lock_file, encoding="utf-8") as fh:
        pins = locked(fh.read())
    installed = {canon(d.metadata["Name"]): d.version for d in md.distributions()}
    problems = []
    for name, want in sorted(pins.items()):
        got = installed.get(name)
        if got is None or got.split("+")[0] != want.split("+")[0]:
            problems.append(f"{name} is {got or 'missing'}, the lock says {want}")
    if "torch" in pins:
        import torch

        cuda = torch.version.cuda or "none"
        if cuda_prefix != "none" and cuda != cuda_prefix and not cuda.startswith(cuda_prefix + "."):
            problems.append(f"torch.version.cuda is {cuda}, the lock says {cuda_prefix}")
        else:
            print(f"torch.version.cuda {cuda}")
    for p in problems:
        print(f"MISMATCH {p}")
    print(f"VERIFIED {len(pins) - len(problems)}/{len(pins)} locked distributions")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
