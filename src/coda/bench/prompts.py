"""The growing message list of a replayed session, sized in tokens to match the trace.

Each round appends the assistant text the endpoint actually returned and then the round's new
input (tool results or a user message) as text of the trace's size, so a real engine's prefix
cache sees real reuse. Sizes are in tokens of a ``Vocabulary``: by default the word tokenizer
shared with the fake engine, which counts them exactly, or an endpoint's own tokenizer; chat
template tokens follow Coda's template (``coda.protocol.tokenizer``). Template tokens are charged
to the round's new input, so a prompt has the trace's ``prompt_tokens`` when the previous round
returned the trace's output length.

Round 0 is the prefix group's system prompt (shared text, so shared KV) plus a user message. A
round with ``prefix_tokens`` (a cache-breaking edit) keeps exactly that many tokens of the
previous context: the message holding the cut is truncated there and continued with new text.
A cut on a message boundary (and a group prompt) also shares the next message's role marker,
one token more than the trace, as any chat template would (and, with odds of one in the
vocabulary size, the first new word repeats the old word at the cut).
"""

from __future__ import annotations

from dataclasses import dataclass

from coda.bench.vocab import Vocabulary, WordVocabulary
from coda.protocol import tokenizer as tok
from coda.workload.schema import Round, Session

OVERHEAD = tok.MESSAGE_OVERHEAD


@dataclass(slots=True)
class Message:
    role: str
    text: str
    tokens: int

    def as_json(self) -> dict[str, str]:
        return {"role": self.role, "content": self.text}


class Conversation:
    """Build with a session; call ``prompt(k)`` before round k and ``reply(text)`` after it."""

    def __init__(self, session: Session, vocab: Vocabulary | None = None) -> None:
        self.session = session
        self.vocab = vocab or WordVocabulary()
        self.messages: list[Message] = []

    def _new(self, role: str, purpose: str, k: int, n: int) -> Message:
        n = max(n, 0)
        return Message(role, self.vocab.text(tok.seed_of(self.session.session_id, k, purpose), n), n)

    @property
    def prompt_tokens(self) -> int:
        """Tokens of the current prompt under the shared template."""
        return sum(m.tokens + OVERHEAD for m in self.messages) + tok.GENERATION_PROMPT

    def prompt(self, k: int) -> list[Message]:
        rnd = self.session.rounds[k]
        if k == 0:
            self._first(rnd)
        elif rnd.prefix_tokens is None:
            # the assistant reply's end marker, the new message's two markers and the generation marker
            self.messages.append(self._new("user", "input", k, rnd.new_input_tokens - OVERHEAD - 1 - tok.GENERATION_PROMPT))
        else:
            self._edit(k, rnd.prefix_tokens, rnd.new_input_tokens)
        return self.messages

    def reply(self, text: str) -> None:
        self.messages.append(Message("assistant", text, self.vocab.count(text)))

    def _first(self, rnd: Round) -> None:
        group = self.session.prefix_group
        new = rnd.new_input_tokens
        if group is not None and rnd.prefix_tokens:
            n = rnd.prefix_tokens - OVERHEAD
            self.messages.append(Message("system", self.vocab.text(tok.seed_of("group", group, n), n), max(n, 0)))
        self.messages.append(self._new("user", "input", 0, new - OVERHEAD - tok.GENERATION_PROMPT))

    def _edit(self, k: int, keep: int, new_input: int) -> None:
        """Keep the first ``keep`` tokens of the context, then ``new_input`` tokens of new text."""
        msgs = self.messages
        i = start = 0  # the message holding the cut, and where it starts
        while i < len(msgs) and keep >= start + OVERHEAD + msgs[i].tokens:
            start += OVERHEAD + msgs[i].tokens
            i += 1
        m = msgs[i] if i < len(msgs) else None
        del self.messages[i + 1 :]
        if m is None or keep == start:  # the cut falls on a message boundary: a new user message follows
            del self.messages[i:]
            self.messages.append(self._new("user", "edit", k, new_input - OVERHEAD - tok.GENERATION_PROMPT))
            return
        j = keep - start - 1  # tokens of the cut message kept (its role marker is the first token)
        x = max(new_input - OVERHEAD, 0)  # new tokens, then the end marker and the generation marker
        kept = self.vocab.truncate(m.text, j)
        extra = self.vocab.text(tok.seed_of(self.session.session_id, k, "edit"), x)
        self.messages[i] = Message(m.role, kept + " " + extra.lstrip() if kept else extra, j + x)
