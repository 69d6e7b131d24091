"""sglang 0.5.23's own request/response models, runnable without torch or a GPU, to validate what
the simulator answers against (tests marked `network`: they fetch the wheel and a small venv).

What the models import, read from the wheel: openai/protocol.py (pydantic) needs msgspec,
pydantic, openai (its `types.responses`, pinned by the wheel's metadata: openai==2.8.0),
xgrammar only inside try/except, and `sglang.utils.convert_json_schema_to_str`. sglang/utils.py
itself imports numpy, IPython, requests and sglang.srt.environ, and sglang/__init__.py pulls
the whole runtime, so both are replaced by stubs: an empty package and a utils module with
that one function (used only for response_format, which no test sends). openai/sse_utils.py
(the chat stream's msgspec structs) and api/v1/api_types.py (the /generate JSON contract)
import msgspec alone. The venv gets the wheel's own pins; it lives under the cache dir.
"""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

from stackbuild.spec.sglang import ensure_wheel, table_from_wheel

VERSION = "0.5.23"
MEMBERS = ("sglang/srt/entrypoints/openai/protocol.py", "sglang/srt/entrypoints/openai/sse_utils.py",
           "sglang/api/v1/api_types.py")
STUB_UTILS = "import json\n\n\ndef convert_json_schema_to_str(schema):\n    return json.dumps(schema)\n"

# Runs in the venv: each case is validated with the named model and serialized back the way
# sglang serializes it; the test compares that with what the simulator sent.
VALIDATE = r'''
import json, sys
import msgspec
from sglang.srt.entrypoints.openai import protocol, sse_utils
from sglang.api.v1 import api_types

out = []
for case in json.load(sys.stdin):
    try:
        kind, name, body = case["dump"], case["model"], case["body"]
        if kind == "msgspec":
            obj = msgspec.json.decode(json.dumps(body), type=getattr(sse_utils, name))
            dumped = json.loads(msgspec.json.encode(obj))
        elif kind == "contract":
            getattr(api_types, name).from_json_value(body)
            dumped = body
        else:
            m = getattr(protocol, name).model_validate(body)
            dumped = json.loads(m.model_dump_json(by_alias=True, exclude_none=kind == "exclude_none"))
        out.append({"ok": True, "dumped": dumped})
    except Exception as e:
        out.append({"ok": False, "error": f"{type(e).__name__}: {e}"})
json.dump(out, sys.stdout)
'''


class SglangModels:
    def __init__(self, root: Path) -> None:
        wheel = ensure_wheel(VERSION, offline=False)
        pins = table_from_wheel(wheel, VERSION).requires
        self.src = root / "src"
        with zipfile.ZipFile(wheel) as z:
            for m in MEMBERS:
                dest = self.src / m
                dest.parent.mkdir(parents=True, exist_ok=True)
                dest.write_bytes(z.read(m))
        for d in [p for p in self.src.rglob("*") if p.is_dir()]:
            (d / "__init__.py").touch()
        (self.src / "sglang" / "utils.py").write_text(STUB_UTILS)
        venv = root / f"venv-openai-{pins['openai']}"
        self.python = venv / "bin" / "python"
        if not self.python.exists():
            subprocess.run(["uv", "venv", "-q", "--python", sys.executable, str(venv)], check=True)
        subprocess.run(["uv", "pip", "install", "-q", "--python", str(self.python),
                        f"openai=={pins['openai']}", "msgspec", "pydantic"], check=True)
        (root / "validate.py").write_text(VALIDATE)
        self.script = root / "validate.py"

    def check(self, cases: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """[{"model", "body", "dump": json|exclude_none|msgspec|contract}] -> [{"ok", ...}]."""
        r = subprocess.run([str(self.python), str(self.script)], input=json.dumps(cases),
                           capture_output=True, text=True, check=True, cwd=self.src,
                           env={"PYTHONPATH": str(self.src), "PATH": "/usr/bin:/bin"})
        return list(json.loads(r.stdout))
