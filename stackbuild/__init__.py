"""stackbuild: YAML stack specs -> images and systemd units -> deployed, gated, promoted."""

__version__ = "0.1.0"
