"""The tool calls a request ended with, read from its output tokens inside the engine.

The hold decision is due when the request finishes, in vLLM's scheduler, and only the engine has the
response then: the API server parses tool calls only after the scheduler has freed the blocks, and
a gateway's hint on the request cannot name calls the response has not made yet. So the scheduler
decodes the tail of the finished output with the model's tokenizer and matches the model's tool-call
format (``RetentionSettings.tool_call_pattern``). It reads only requests that stopped on their own
(an end-of-sequence or stop token), never those cut by ``max_tokens`` or aborted.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any


class ToolCallReader:
    """Tool names in the last ``tail_tokens`` output tokens, in order of appearance, each once."""

    def __init__(self, tokenizer: Any, pattern: str, tail_tokens: int) -> None:
        self._decode = tokenizer.decode
        self._pattern = re.compile(pattern)
        self._tail = tail_tokens

    def tools(self, output_token_ids: Sequence[int]) -> tuple[str, ...]:
        text = self._decode(list(output_token_ids[-self._tail:]))
        names: dict[str, None] = {}
        for m in self._pattern.finditer(text):
            for name in m.groupdict().values():
                if name:
                    names[name] = None
        return tuple(names)
