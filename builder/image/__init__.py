"""Images: BuildKit builds through a docker CLI, the Docker Engine SDK for everything else."""

from __future__ import annotations

from builder.image.build import BuildResult, build_stack
from builder.registry import promote

__all__ = ["BuildResult", "build_stack", "promote"]
