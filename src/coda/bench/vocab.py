"""What prompt text is made of, and how its tokens are counted.

``WordVocabulary`` is the word tokenizer shared with ``coda fake-engine`` (exact there).
``HFVocabulary`` sizes text in an endpoint's own tokens (``--tokenizer`` with a Hugging Face
``tokenizer.json``): text is a leading space then words that are one token each after a space,
so a text of n words is n tokens, checked with the tokenizer and trimmed or padded to be exact.
Chat-template tokens stay approximated by Coda's template (two per message, one for the
generation prompt), since the endpoint's template is not known to the client.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Protocol

import numpy as np

from coda.errors import CodaError
from coda.protocol import tokenizer as tok


class Vocabulary(Protocol):
    name: str

    def text(self, seed: int, n: int) -> str:
        """A deterministic text of exactly ``n`` tokens, which keeps its count after a space."""
        ...

    def count(self, text: str) -> int: ...

    def truncate(self, text: str, n: int) -> str:
        """The text of the first ``n`` tokens of ``text``."""
        ...


class WordVocabulary:
    name = "coda word tokenizer: whitespace-separated words under Coda's chat template (exact for coda fake-engine)"

    def text(self, seed: int, n: int) -> str:
        return tok.text(seed, n)

    def count(self, text: str) -> int:
        return tok.count_tokens(text)

    def truncate(self, text: str, n: int) -> str:
        return " ".join(text.split()[:n])


class HFVocabulary:
    def __init__(self, path: str | Path) -> None:
        from tokenizers import Tokenizer

        path = Path(path)
        file = path / "tokenizer.json" if path.is_dir() else path
        if not file.exists():
            raise CodaError(f"--tokenizer {path}: no tokenizer.json there; pass a Hugging Face tokenizer file or its directory")
        try:
            self.tokenizer = Tokenizer.from_file(str(file))
        except Exception as err:  # the tokenizers library raises plain Exceptions for bad files
            raise CodaError(f"--tokenizer {file}: not a Hugging Face tokenizer file: {err}".splitlines()[0]) from None
        self.name = f"Hugging Face tokenizer {file} (message contents exact; chat-template tokens approximated)"
        candidates = sorted(
            {
                piece.strip()
                for piece in (self.tokenizer.decode([i]) for i in self.tokenizer.get_vocab().values())
                if re.fullmatch(r" [a-z]{2,12}", piece)
            }
        )
        encoded = self.tokenizer.encode_batch([" " + w for w in candidates], add_special_tokens=False)
        self.words = np.array([w for w, e in zip(candidates, encoded) if len(e.ids) == 1])
        if self.words.size < 100:
            raise CodaError(f"--tokenizer {file}: found only {self.words.size} single-token words; a BPE or WordPiece vocabulary is needed")

    def count(self, text: str) -> int:
        return len(self.tokenizer.encode(text, add_special_tokens=False).ids)

    def truncate(self, text: str, n: int) -> str:
        ids = self.tokenizer.encode(text, add_special_tokens=False).ids[:n]
        return self.tokenizer.decode(ids)

    def text(self, seed: int, n: int) -> str:
        if n <= 0:
            return ""
        rng = np.random.default_rng(seed)
        words = self.words[rng.integers(0, self.words.size, n)].tolist()
        text = " " + " ".join(words)
        for _ in range(4):  # a tokenizer that merges across spaces: trim or pad until the count is exact
            have = self.count(text)
            if have == n or not words:
                break
            if have > n:
                words.pop()
            else:
                words.append(str(self.words[rng.integers(0, self.words.size)]))
            text = " " + " ".join(words)
        return text
