"""The SGLang-compatible simulated server: timing model, profiles, faults, HTTP API."""
