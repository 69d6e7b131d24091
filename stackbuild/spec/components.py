"""The component table: one entry per component a stack builds (torch, sgl_kernel, flashinfer, sglang).

Each entry is everything the pipeline knows about a component: its distribution name on the index,
its import name, the model of its `components.NAME:` spec, how its source build runs (build tools and
their pins, where its pyproject sits in the repository, CMake definitions it always gets) and its
ahead-of-time kernel build. The lock (target), the facts and rules, the renderer and the smoke test
all read it; the table's order is the order of the Dockerfile's stages, most stable first.
Adding a component is one entry here, plus its block in templates/Dockerfile.sglang.j2 only if it
needs a stage of its own (as flashinfer's AOT build does).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, Field, create_model, field_validator

from stackbuild.spec.kinds import EnvName, GitRef, Url, Version


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class SourceBuild(_Model):
    repo: Url
    ref: GitRef
    env: dict[EnvName, str] = Field(default_factory=dict)
    # CMake cache variables (-D NAME=VALUE), passed as pip --config-settings=cmake.define.NAME=VALUE
    cmake: dict[EnvName, str] = Field(default_factory=dict)


class Component(_Model):
    """A pinned wheel (version + index) or a source build (repo, ref, env)."""

    version: Version
    index: Url | None = None
    source: SourceBuild | None = None

    @property
    def kind(self) -> str:
        return "source" if self.source is not None else "wheel"


class FlashinferAot(_Model):
    """FlashInfer's own AOT build, run in the image: kernels compiled for `arches` land where its runtime loads them."""

    # flashinfer's FLASHINFER_CUDA_ARCH_LIST words: "MAJOR.MINOR" with an optional a/f suffix (12.0f)
    arches: tuple[str, ...] = Field(min_length=1)

    @field_validator("arches")
    @classmethod
    def _arch_words(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        for a in v:
            if not re.fullmatch(r"\d{1,2}\.\d[af]?", a):
                raise ValueError(
                    f"flashinfer arch '{a}' must look like '12.0f', '10.0a' or '9.0' (as in FLASHINFER_CUDA_ARCH_LIST)"
                )
        return v


class FlashinferComponent(Component):
    aot: FlashinferAot | None = None


# What a source stage installs before its --no-build-isolation build when its entry names nothing else.
DEFAULT_BUILD_TOOLS = ("setuptools==75.6.0",)


@dataclass(frozen=True)
class Aot:
    """A component's own ahead-of-time kernel build, run in an image stage of its own (its template block)."""

    script: str  # the driver under templates/ that the stage runs
    package_dir: str  # where the installed package loads its AOT modules from, under site-packages
    label: str  # how messages name its modules

    def dir_for(self, python: str) -> str:
        return f"/opt/venv/lib/python{python}/site-packages/{self.package_dir}"


@dataclass(frozen=True)
class Entry:
    name: str  # the key under `components:`, and the name of its build stage
    dist: str  # its distribution name on the index, spelled as sglang's Requires-Dist spells it
    module: str  # what the image imports to prove it loads (the GPU smoke test)
    model: type[Component] = Component  # the model of its `components.NAME:` spec
    # What its source stage installs before its --no-build-isolation build: the build backend its
    # pyproject [build-system].requires names. `stackbuild lock` hash-pins them into STACK.build-tools.txt.
    build_tools: tuple[str, ...] = DEFAULT_BUILD_TOOLS
    source_subdir: str = ""  # where its pyproject sits in its repository
    build_requirements: str = ""  # a requirements file in its repository, installed before the build
    cmake_defines: tuple[tuple[str, str], ...] = ()  # what every source build passes (ours, not user data)
    build_base: bool = False  # built from source, it is installed in its stage and the other stages build FROM it
    aot: Aot | None = None


COMPONENTS: tuple[Entry, ...] = (
    # torch's setup.py build installs its repository's requirements.txt first
    Entry("torch", dist="torch", module="torch", build_requirements="requirements.txt", build_base=True),
    # sglang-kernel (import sgl_kernel) builds with scikit-build-core (+ CMake) from sgl-kernel/ of sglang's
    # repository; SGL_KERNEL_COMPILE_THREADS, a CMake cache variable, is nvcc's --threads (its default 32 times
    # MAX_JOBS can exhaust a build box's memory): shared/notes/sglang-blackwell.md
    Entry(
        "sgl_kernel",
        dist="sglang-kernel",
        module="sgl_kernel",
        build_tools=("scikit-build-core==0.11.5", "cmake==3.31.6"),
        source_subdir="sgl-kernel",
        cmake_defines=(("SGL_KERNEL_COMPILE_THREADS", "${NVCC_THREADS}"),),
    ),
    # flashinfer 0.7.2 loads AOT modules from <package>/data/aot (jit/env.py:238)
    Entry(
        "flashinfer",
        dist="flashinfer-python",
        module="flashinfer",
        model=FlashinferComponent,
        aot=Aot(script="flashinfer_aot.py", package_dir="flashinfer/data/aot", label="FlashInfer"),
    ),
    Entry("sglang", dist="sglang", module="sglang"),
)
BY_NAME: dict[str, Entry] = {e.name: e for e in COMPONENTS}


def dist_of(name: str) -> str:
    """A component's distribution name."""
    return BY_NAME[name].dist


class ComponentsBase(_Model):
    """A stack's components, one optional field per entry of the table (Components, below, adds them)."""

    def get(self, name: str) -> Component | None:
        c = getattr(self, name) if name in BY_NAME else None
        return c if isinstance(c, Component) else None

    def items(self) -> list[tuple[str, Component]]:
        """The components a stack names, in the table's order."""
        return [(e.name, c) for e in COMPONENTS if (c := self.get(e.name)) is not None]


# The spec model's fields come from the table, so a new entry is a new `components.NAME:` key (unknown
# keys are still refused with their position). mypy sees the base, which offers get() and items().
if TYPE_CHECKING:
    Components = ComponentsBase
else:
    Components = create_model(
        "Components", __base__=ComponentsBase, **{e.name: (e.model | None, None) for e in COMPONENTS}
    )


def aot_arches(c: Component | None) -> tuple[str, ...]:
    """The arches a component's spec asks its AOT build for (a model with an `aot:` key; none otherwise)."""
    aot = getattr(c, "aot", None)
    return tuple(aot.arches) if aot is not None else ()
