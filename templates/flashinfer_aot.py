"""Run in the image's flashinfer-aot stage: FlashInfer's own AOT build of the installed (locked) wheel.

usage: python flashinfer_aot.py AOT_DIR BUILD_DIR
Needs FLASHINFER_CUDA_ARCH_LIST and nvcc (CUDA_HOME); no GPU. Exits 1 when the
installed flashinfer would not load modules from AOT_DIR or nothing was built.

Facts, from flashinfer-python 0.7.2 (the wheel on PyPI):
- aot.py:1212 compile_and_package_modules(out_dir, build_dir, project_root, ...) is
  what `python -m flashinfer.aot` and the flashinfer-jit-cache build both call; it
  reads sources from a checkout's layout (aot.py:1243-1249: project_root/csrc,
  include, 3rdparty/cutlass, 3rdparty/spdlog) and writes OUT/NAME/NAME.so
  (copy_built_kernels, aot.py:1198). `python -m flashinfer.aot` itself takes
  project_root from the installed file (aot.py:1552), which in site-packages has
  no csrc/, so it cannot build from the wheel.
- The wheel ships those trees under flashinfer/data/ (build_backend.py:1110-1114
  links 3rdparty/cutlass -> data/cutlass, ... csrc -> data/csrc): a root of links
  back to them compiles exactly the sources the runtime JIT would.
- jit/env.py:238 FLASHINFER_AOT_DIR = <package>/data/aot, and get_aot_artifacts
  (env.py:298) loads <AOT_DIR>/NAME/NAME.so before any jit-cache provider or JIT.
"""

import os
import pathlib
import sys

# checkout layout (what aot.py reads) -> where the wheel keeps it under flashinfer/data/
LAYOUT = {
    "csrc": "csrc",
    "include": "include",
    "3rdparty/cutlass": "cutlass",
    "3rdparty/spdlog": "spdlog",
    "3rdparty/cccl": "cccl",
}


def source_root(data: pathlib.Path, root: pathlib.Path) -> pathlib.Path:
    for rel, target in LAYOUT.items():
        link = root / rel
        link.parent.mkdir(parents=True, exist_ok=True)
        if not link.is_symlink():
            link.symlink_to(data / target, target_is_directory=True)
    return root


def main(aot_dir: str, build_dir: str) -> int:
    if not os.environ.get("FLASHINFER_CUDA_ARCH_LIST"):
        print("FLASHINFER_CUDA_ARCH_LIST is not set", file=sys.stderr)
        return 1
    from flashinfer import aot
    from flashinfer.jit import env as jit_env

    out = pathlib.Path(aot_dir)
    if jit_env.FLASHINFER_AOT_DIR.resolve() != out.resolve():
        print(f"flashinfer loads AOT modules from {jit_env.FLASHINFER_AOT_DIR}, not {out}", file=sys.stderr)
        return 1
    build = pathlib.Path(build_dir)
    root = source_root(jit_env.FLASHINFER_DATA, build / "src")
    aot.compile_and_package_modules(
        out_dir=out, build_dir=build / "aot", project_root=root, config=None, verbose=True, skip_prebuilt=False
    )
    built = sorted(out.glob("*/*.so"))
    if not built:
        print(f"flashinfer's AOT build wrote no modules to {out}", file=sys.stderr)
        return 1
    print(f"AOT {len(built)} modules for {os.environ['FLASHINFER_CUDA_ARCH_LIST']} in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
