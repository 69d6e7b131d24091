"""Deterministic "greedy" text: the output is a function of the prompt alone.

Speculative decoding does not change greedy output, so every profile produces
the same text for the same prompt; that is what the gate's probe relies on.
"""

from __future__ import annotations

import hashlib
import random

_ONSETS = ("b", "c", "d", "f", "g", "l", "m", "n", "p", "r", "s", "t", "v", "st", "tr", "pl")
_VOWELS = ("a", "e", "i", "o", "u", "ai", "ou")
_CODAS = ("", "n", "r", "s", "l", "nd", "th")

# id -> piece; 0 is what a model with NaN logits keeps picking
VOCAB: tuple[str, ...] = (
    "!",
    *(" " + o + v + c for o in _ONSETS for v in _VOWELS for c in _CODAS),
    *(f" {w}" for w in ("the", "of", "and", "to", "in", "is", "a", "that")),
    ".",
    ",",
)
VOCAB_SIZE = len(VOCAB)


def prompt_key(text: str | None, input_ids: list[int] | None) -> bytes:
    if input_ids is not None:
        return b"ids:" + ",".join(map(str, input_ids)).encode()
    return b"text:" + (text or "").encode()


def greedy_ids(key: bytes, n: int, *, temperature: float = 0.0, rid: str = "") -> list[int]:
    """The first n token ids of the continuation; temperature > 0 mixes in the request id."""
    seed_src = key if temperature <= 0 else key + b"|" + rid.encode()
    rng = random.Random(hashlib.sha256(seed_src).digest())
    return [rng.randrange(1, VOCAB_SIZE) for _ in range(n)]


def detokenize(ids: list[int], *, legacy_space: bool = False) -> str:
    """The text of `ids`. legacy_space: a detokenizer that drops the leading space of the
    first piece (sentencepiece's add_dummy_prefix / `legacy` handling changed between
    tokenizer releases): the same ids, other text."""
    text = "".join(VOCAB[i % VOCAB_SIZE] for i in ids)
    return text[1:] if legacy_space and text.startswith(" ") else text


# A ChatML template, as many chat models ship in tokenizer_config.json; sglang renders the
# model's own template with jinja (openai/serving_chat.py _apply_jinja_template) and then
# tokenizes the result.
_TURN = "<|im_start|>{role}\n{content}<|im_end|>\n"
# what a template revision that adds a default system turn inserts (Qwen2.5's did)
DEFAULT_SYSTEM = "You are a helpful assistant."


def chat_prompt(messages: list[tuple[str, str]], *, default_system: bool = False) -> str:
    """The prompt text the chat template renders from (role, content) turns, with the
    generation prompt for the assistant's answer."""
    turns = list(messages)
    if default_system and (not turns or turns[0][0] != "system"):
        turns.insert(0, ("system", DEFAULT_SYSTEM))
    return "".join(_TURN.format(role=r, content=c) for r, c in turns) + \
        "<|im_start|>assistant\n"


def count_prompt_tokens(text: str | None, input_ids: list[int] | None) -> int:
    if input_ids is not None:
        return len(input_ids)
    # roughly one token per word piece, at least one
    return max(1, len((text or "").split()))
