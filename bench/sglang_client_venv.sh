#!/usr/bin/env bash
# Builds the venv that runs SGLang's own benchmark client (python -m sglang.bench_serving)
# on a CPU-only machine, as bench/gate_accuracy.py --sglang-client uses it.
# Recipe: /work/shared/notes/sglang-blackwell.md, "SGLang's own benchmark client does run on a
# CPU machine". About 6 GB; lives under the user cache dir, never in the repo.
# Safe to repeat: an existing venv is reused, pip skips what is installed.
#   usage: bench/sglang_client_venv.sh [VENV_DIR]
set -euo pipefail
venv="${1:-${XDG_CACHE_HOME:-$HOME/.cache}/stackbuild/sglang-client-venv}"
py="$venv/bin/python"
if [ ! -x "$py" ]; then
  if command -v uv >/dev/null; then uv venv --python python3 "$venv"; else python3 -m venv "$venv"; fi
fi
# uv is several times faster than pip on the torch wheels; both read the same index.
if command -v uv >/dev/null; then pipi=(uv pip install --python "$py"); else pipi=("$py" -m pip install); fi
# torch: the PyPI CUDA build imports fine without a GPU (sglang imports it at module level).
"${pipi[@]}" torch==2.14.1 torchvision==0.29.1
# --no-deps: sglang's own requirements pull the GPU kernels (sgl-kernel, flashinfer) the client never uses.
"${pipi[@]}" --no-deps sglang==0.5.23
"${pipi[@]}" aiohttp msgspec numpy orjson requests tqdm transformers psutil pybase64 triton \
  pillow starlette pyzmq IPython datasets apache-tvm-ffi==0.1.11 sentencepiece compressed_tensors \
  gguf tokenizers
# A tiny local tokenizer: the client needs one to make random-ids prompts and count output
# tokens, and no model hub is reachable from here.
tok="$venv/tokenizer"
if [ ! -f "$tok/tokenizer.json" ]; then
  "$py" - "$tok" <<'PY'
import sys
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast
vocab = {"[UNK]": 0, "[BOS]": 1, "[EOS]": 2}
vocab.update({f"w{i}": i + 3 for i in range(1000)})
t = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
t.pre_tokenizer = pre_tokenizers.Whitespace()
PreTrainedTokenizerFast(tokenizer_object=t, unk_token="[UNK]", bos_token="[BOS]",
                        eos_token="[EOS]").save_pretrained(sys.argv[1])
PY
fi
"$py" -c "import sglang.bench_serving" && echo "ok: $py (tokenizer $tok)"
