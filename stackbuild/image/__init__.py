"""Images: BuildKit builds through a docker CLI (build, buildkit), the Docker Engine SDK for
everything else (engine), the build context and its hash inputs (context), the smoke test."""
