"""The engine's own tokenizer and chat template, run inside the gateway (``indexer.tokenizer:
engine`` with ``indexer.tokenizer_path``), so prompts are named by the token ids vLLM's KV events
carry without a ``/tokenize`` round trip.

The tokenizer is the model's ``tokenizer.json`` through ``tokenizers`` (Rust); the chat template
(``chat_template.jinja`` or ``tokenizer_config.json``'s ``chat_template``) is rendered with
Jinja2 the way transformers renders it (sandboxed, ``trim_blocks``, ``lstrip_blocks``,
``tojson``, ``raise_exception``), then encoded without special tokens, as vLLM encodes a rendered
chat; a completions prompt is encoded with them. A message whose content is not a string, or a
template that fails, returns ``None`` (the caller asks the engine instead).

Tokenizing a 128K-token prompt costs a few hundred milliseconds even in Rust, and an agent
re-sends its whole context every round, so each session keeps checkpoints of its last prompt:
about every ``CHECKPOINT_CHARS`` characters, a token that starts a line (where byte-level
pre-tokenizers always cut) with a CRC of the text before it. A new prompt reuses the token ids
up to the last checkpoint whose text it still starts with and encodes only the rest; sessions'
checkpoints and ids are bounded by ``cache_bytes`` (least recently seen dropped first).
"""

from __future__ import annotations

import json
import zlib
from array import array
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Encoding, Tokenizer

from coda.errors import CodaError

CHECKPOINT_CHARS = 2048
SPECIAL_KEYS = ("bos_token", "eos_token", "unk_token", "pad_token")


@dataclass(slots=True)
class _Checkpoint:
    char: int  # where a token starts in the text
    token: int  # its index
    crc: int  # CRC-32 of text[:char] (UTF-8)


@dataclass(slots=True)
class _Cached:
    ids: array
    checkpoints: list[_Checkpoint]

    @property
    def nbytes(self) -> int:
        return self.ids.itemsize * len(self.ids) + 64 * len(self.checkpoints)


def _raise(message: str) -> None:
    raise jinja2.TemplateError(message)


class LocalTokenizer:
    """A model's tokenizer and chat template, with per-session incremental encoding."""

    def __init__(self, path: str | Path, cache_bytes: int = 64 * 2**20, checkpoint_chars: int = CHECKPOINT_CHARS) -> None:
        root = Path(path)
        file = root / "tokenizer.json" if root.is_dir() else root
        folder = file.parent
        if not file.is_file():
            raise CodaError(f"indexer.tokenizer_path {path}: no tokenizer.json there; give the served model's folder (with its "
                            "tokenizer.json and chat template) or the tokenizer.json itself")
        self.tokenizer = Tokenizer.from_file(str(file))
        cfg_file = folder / "tokenizer_config.json"
        cfg = json.loads(cfg_file.read_text()) if cfg_file.exists() else {}
        self.specials = {k: v.get("content") if isinstance(v, dict) else v for k in SPECIAL_KEYS if (v := cfg.get(k)) is not None}
        source = (folder / "chat_template.jinja").read_text() if (folder / "chat_template.jinja").exists() else cfg.get("chat_template")
        if isinstance(source, list):  # named templates: the default one
            source = next((t["template"] for t in source if t.get("name") == "default"), None)
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
        env.filters["tojson"] = lambda x, ensure_ascii=False, indent=None, separators=None, sort_keys=False: json.dumps(
            x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)
        env.globals.update(raise_exception=_raise, strftime_now=lambda fmt: datetime.now().strftime(fmt))
        self.template = env.from_string(source) if isinstance(source, str) else None
        self.cache_bytes = cache_bytes
        self.checkpoint_chars = checkpoint_chars
        self._cache: OrderedDict[str, _Cached] = OrderedDict()
        self._bytes = 0

    # --- rendering -------------------------------------------------------------------------
    def render_chat(self, messages: Sequence[Any], tools: Sequence[Any] | None) -> str | None:
        """The chat as the engine's template renders it, with the generation prompt; ``None`` when
        it cannot be rendered here (no template, non-string content, a template error)."""
        if self.template is None or not all(isinstance(m, dict) and isinstance(m.get("content", ""), str | None) for m in messages):
            return None
        try:
            return self.template.render(messages=[_with_parsed_arguments(m) for m in messages], tools=tools or None,
                                        add_generation_prompt=True, **self.specials)
        except (jinja2.TemplateError, TypeError, ValueError):
            return None

    # --- encoding --------------------------------------------------------------------------
    def encode(self, text: str, special: bool, session: str | None = None) -> Sequence[int]:
        """Token ids of ``text``; with a session, only what follows its last reusable checkpoint is encoded."""
        if session is None:
            return self.tokenizer.encode(text, add_special_tokens=special).ids
        old = self._cache.pop(session, None)
        if old is not None:
            self._bytes -= old.nbytes
        data = text.encode()
        cp = _reusable(old, data) if old is not None else None
        if cp is None or old is None:
            enc = self.tokenizer.encode(text, add_special_tokens=special)
            ids, kept, suffix, start = array("I", enc.ids), [], text, _Checkpoint(0, 0, 0)
        else:
            suffix = data[cp.char :].decode()
            enc = self.tokenizer.encode(suffix, add_special_tokens=False)
            ids = old.ids[: cp.token]
            ids.extend(enc.ids)
            kept, start = [c for c in old.checkpoints if c.char <= cp.char], cp
        entry = _Cached(ids, kept + _checkpoints(suffix, _token_starting_at(enc), start, cp.token if cp else 0, self.checkpoint_chars))
        self._cache[session] = entry
        self._bytes += entry.nbytes
        while len(self._cache) > 1 and self._bytes > self.cache_bytes:
            self._bytes -= self._cache.popitem(last=False)[1].nbytes
        return ids  # the session's own copy: the next call slices it, never changes it

    def forget(self, session: str) -> None:
        """Drop the session's checkpoints and ids."""
        old = self._cache.pop(session, None)
        if old is not None:
            self._bytes -= old.nbytes


def _with_parsed_arguments(m: dict[str, Any]) -> dict[str, Any]:
    """As vLLM does before rendering: an assistant message's tool-call arguments as objects, not JSON strings."""
    calls = m.get("tool_calls")
    if not isinstance(calls, list):
        return m
    out = []
    for c in calls:
        fn = c.get("function") if isinstance(c, dict) else None
        if isinstance(fn, dict) and isinstance(fn.get("arguments"), str):
            try:
                c = {**c, "function": {**fn, "arguments": json.loads(fn["arguments"])}}
            except ValueError:
                pass
        out.append(c)
    return {**m, "tool_calls": out}


def _reusable(old: _Cached, data: bytes) -> _Checkpoint | None:
    """The last checkpoint of ``old`` whose text ``data`` still starts with."""
    best, crc, at = None, 0, 0
    for cp in old.checkpoints:
        if cp.char > len(data):
            break
        crc = zlib.crc32(data[at : cp.char], crc)
        at = cp.char
        if crc != cp.crc:
            break
        best = cp
    return best


def _token_starting_at(enc: Encoding) -> Callable[[int], int | None]:
    """The index of ``enc``'s token that starts at a character, or ``None``: asked of the few
    characters a checkpoint might take, where converting every token's offsets to Python tuples
    cost more than the encoding (and their allocations set off the garbage collector)."""

    def at(char: int) -> int | None:
        k = enc.char_to_token(char)
        return k if k is not None and enc.token_to_chars(k)[0] == char else None

    return at


def _checkpoints(suffix: str, token_at: Callable[[int], int | None], start: _Checkpoint, base_token: int, every: int) -> list[_Checkpoint]:
    """Checkpoints in ``suffix`` (the text after ``start``, whose tokens ``token_at`` finds), about
    one ``every`` characters: at a token that starts right after a newline and not with whitespace,
    where byte-level BPE pre-tokenizers (GPT-2, Llama 3, Qwen, ...) always start a new piece."""
    out: list[_Checkpoint] = []
    crc, byte, last = start.crc, start.char, 0
    want = every
    while (j := suffix.find("\n", want)) >= 0 and j + 1 < len(suffix):
        c = j + 1
        want = c + 1
        k = None if suffix[c].isspace() else token_at(c)
        if k is None:
            continue
        chunk = suffix[last:c].encode()
        crc, byte, last = zlib.crc32(chunk, crc), byte + len(chunk), c
        out.append(_Checkpoint(byte, base_token + k, crc))
        want = c + every
    return out
