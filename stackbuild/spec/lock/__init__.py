"""The resolved closure of a stack: a hash-pinned requirements lock and a binary audit of its wheels.

`target` says what a stack resolves for (python, platform, indexes, fixed inputs),
`resolve` runs uv and reads/writes the lock file, `wheels` fetches wheels by
sha256, `elf` reads ELF NEEDED and `.nv_fatbin` arches, `audit` turns those into
per-wheel facts (cached by sha256), `check` turns lock and audit into findings.
"""
