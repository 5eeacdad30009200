"""The growing message list of a replayed session, sized in tokens to match the trace.

Each round appends the assistant text the endpoint actually returned and then the round's new
input (tool results or a user message) as text of the trace's size, so a real engine's prefix
cache sees real reuse. Sizes are in tokens of the shared word tokenizer (``coda.engines.tokenizer``)
under its chat template, which the fake engine counts exactly; against another engine they are a
stated approximation. Template tokens are charged to the round's new input, so a prompt has the
trace's ``prompt_tokens`` when the previous round returned the trace's output length.

Round 0 is the prefix group's system prompt (shared text, so shared KV) plus a user message. A
round with ``prefix_tokens`` (a cache-breaking edit) keeps exactly that many tokens of the
previous context: the message holding the cut is truncated there and continued with new text.
A cut on a message boundary (and a group prompt) also shares the next message's role marker,
one token more than the trace, as any chat template would.
"""

from __future__ import annotations

from dataclasses import dataclass

from coda.engines import tokenizer as tok
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

    def __init__(self, session: Session) -> None:
        self.session = session
        self.messages: list[Message] = []

    def _new(self, role: str, purpose: str, k: int, n: int) -> Message:
        n = max(n, 0)
        return Message(role, tok.text(tok.seed_of(self.session.session_id, k, purpose), n), n)

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
        self.messages.append(Message("assistant", text, tok.count_tokens(text)))

    def _first(self, rnd: Round) -> None:
        group = self.session.prefix_group
        new = rnd.new_input_tokens
        if group is not None and rnd.prefix_tokens:
            n = rnd.prefix_tokens - OVERHEAD
            self.messages.append(Message("system", tok.text(tok.seed_of("group", group, n), n), max(n, 0)))
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
        j = keep - start - 1  # words of the cut message kept (its role marker is the first token)
        kept = m.text.split()[:j]
        # The first new word differs from the old word at the cut, so reuse ends exactly at `keep`;
        # then the end marker and the generation marker: the prompt has keep + new_input tokens.
        x = max(new_input - OVERHEAD, 0)
        extra = ([tok.EDIT_WORD] + tok.words(tok.seed_of(self.session.session_id, k, "edit"), x - 1))[:x]
        self.messages[i] = Message(m.role, " ".join(kept + extra), len(kept) + len(extra))
