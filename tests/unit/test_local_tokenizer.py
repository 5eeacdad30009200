"""The gateway's copy of an engine's tokenizer: a chat rendered with the model's template and
encoded as vLLM encodes it, and per-session incremental encoding that gives exactly the ids a
full encoding gives, whatever a session appends (hypothesis)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from coda.errors import CodaError
from coda.gateway.local_tokenizer import LocalTokenizer
from coda.gateway.prompt import EngineTokenizer

TEMPLATE = ("{% for m in messages %}<s>{{ m['role'] }}: {{ m['content'] if m['content'] is string else '' }}\n{% endfor %}"
            "{% if tools %}tools: {{ tools | tojson }}\n{% endif %}{% if add_generation_prompt %}<s>assistant: {% endif %}")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """A byte-level BPE (the GPT-2 / Llama 3 / Qwen family's pre-tokenizer) and a chat template."""
    out = tmp_path_factory.mktemp("tok")
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    corpus = " ".join(f"word{i} tool{i % 50} file{i % 97}.py def return import class result\n" for i in range(2000))
    tok.train_from_iterator([corpus] * 2, trainers.BpeTrainer(vocab_size=600, special_tokens=["<unk>", "<s>", "</s>"],
                                                                initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<s>", "eos_token": "</s>", "chat_template": TEMPLATE}))
    return out


def test_a_chat_is_rendered_with_the_model_s_template_and_tools(model_dir):
    local = LocalTokenizer(model_dir)
    text = local.render_chat([{"role": "user", "content": "open file3.py"}], [{"type": "function", "function": {"name": "read"}}])
    assert text == '<s>user: open file3.py\ntools: [{"type": "function", "function": {"name": "read"}}]\n<s>assistant: '
    assert local.render_chat([{"role": "user", "content": [{"type": "image_url"}]}], None) is None  # the engine renders parts
    prompt = EngineTokenizer(local).local_prompt("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}, None)
    assert prompt is not None and list(prompt.units) == local.tokenizer.encode("<s>user: hi\n<s>assistant: ", add_special_tokens=False).ids
    with pytest.raises(CodaError, match="no tokenizer.json"):
        LocalTokenizer(model_dir / "missing")


PIECES = [*"abc xyz\n\t.é日", "word1", " tool7", "file3.py", "  ", "\n\n", " \n"]
lines = st.lists(st.lists(st.sampled_from(PIECES), max_size=30).map("".join), min_size=1, max_size=30).map("\n".join)


@settings(max_examples=60)
@given(rounds=st.lists(st.tuples(lines, st.booleans()), min_size=1, max_size=6), first=lines)
def test_incremental_encoding_equals_a_full_encoding(model_dir, rounds, first):
    local = LocalTokenizer(model_dir)
    local_small = LocalTokenizer(model_dir, checkpoint_chars=8)  # checkpoints every few characters: reuse on short texts too
    messages = [{"role": "system", "content": first * 20}]

    for content, edit in rounds:
        if edit and len(messages) > 1:
            messages[-1] = {**messages[-1], "content": messages[-1]["content"][:-3] + "!"}  # an earlier message changed
        messages.append({"role": "user", "content": content})
        text = local.render_chat(messages, None)
        assert text is not None
        full = local.tokenizer.encode(text, add_special_tokens=False).ids
        assert list(local.encode(text, False, "s")) == full
        assert list(local_small.encode(text, False, "s")) == full
