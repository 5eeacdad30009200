"""The word tokenizer and chat template shared by ``coda bench`` and ``coda fake-engine``.

A token is a whitespace-separated word. Real engines use BPE vocabularies; this is a stated
approximation that lets the bench size prompt text in tokens and the fake engine count and hash
exactly what it receives, with no token count travelling beside the request. The template is
append-only: a message renders as ``<|role|>`` + its words + ``<|end|>`` and a prompt ends with
the generation marker ``<|assistant|>``, so a prompt plus the assistant's reply is a prefix of
the next prompt of the conversation, as with real chat templates, and a prefix cache sees the
reuse a real engine would.

KV blocks are named by chained hashes of their words (a block's hash covers its whole prefix),
as vLLM names blocks; token ids (for ``/tokenize`` and KV events) are stable hashes of words.
"""

from __future__ import annotations

import hashlib
import random
import zlib
from collections.abc import Iterable, Sequence

import numpy as np

MESSAGE_OVERHEAD = 2  # <|role|> and <|end|>
GENERATION_PROMPT = 1  # the trailing <|assistant|>
END = "<|end|>"
VOCAB_SIZE = 151_936  # token-id range (Qwen's vocabulary size; ids are hashes of words)

_CONSONANTS = "bdfghjklmnprstvz"
_VOWELS = "aeiou"
_SYLLABLES = [c + v for c in _CONSONANTS for v in _VOWELS]
# 80 syllables -> 6,400 two-syllable words: short, pronounceable, and never a template marker.
VOCAB = np.array([a + b for a in _SYLLABLES for b in _SYLLABLES])
_VOCAB_LIST: list[str] = VOCAB.tolist()


def role_marker(role: str) -> str:
    return f"<|{role}|>"


def count_tokens(text: str) -> int:
    return len(text.split())


def render(messages: Iterable[tuple[str, str]]) -> list[str]:
    """Token words of a chat prompt: each (role, text) message, then the generation marker."""
    out: list[str] = []
    for role, text in messages:
        out.append(role_marker(role))
        out.extend(text.split())
        out.append(END)
    out.append(role_marker("assistant"))
    return out


def seed_of(*parts: object) -> int:
    """A stable 64-bit seed from any printable parts (Python's hash() is salted per process)."""
    return int.from_bytes(hashlib.blake2b("\x1f".join(map(str, parts)).encode(), digest_size=8).digest(), "big")


def words(seed: int, n: int) -> list[str]:
    """``n`` deterministic vocabulary words for ``seed`` (Python's generator for short texts, where
    numpy's setup dominates; numpy's for long ones)."""
    if n <= 0:
        return []
    if n < 512:
        return random.Random(seed).choices(_VOCAB_LIST, k=n)
    rng = np.random.default_rng(seed)
    return VOCAB[rng.integers(0, VOCAB.size, n)].tolist()


def text(seed: int, n: int) -> str:
    return " ".join(words(seed, n))


def token_ids(tokens: Sequence[str]) -> list[int]:
    return [zlib.crc32(w.encode()) % VOCAB_SIZE for w in tokens]


def block_hashes(tokens: Sequence[str], block_tokens: int, parent: int | None = None) -> list[int]:
    """Chained 64-bit hashes of the full ``block_tokens``-word blocks of ``tokens``."""
    out: list[int] = []
    prev = (parent or 0).to_bytes(8, "big")
    for i in range(0, len(tokens) - block_tokens + 1, block_tokens):
        digest = hashlib.blake2b(prev + "\x1f".join(tokens[i : i + block_tokens]).encode(), digest_size=8).digest()
        out.append(int.from_bytes(digest, "big"))
        prev = digest
    return out
