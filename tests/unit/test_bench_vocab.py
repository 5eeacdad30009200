"""`coda bench --tokenizer`: prompt contents sized exactly in an endpoint's own tokens, with a
small BPE tokenizer trained here (no download)."""

from __future__ import annotations

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from coda.bench.prompts import Conversation
from coda.bench.vocab import HFVocabulary
from coda.errors import CodaError
from coda.protocol import tokenizer as tok
from coda.workload.schema import Round, Session


@pytest.fixture(scope="module")
def vocab(tmp_path_factory) -> HFVocabulary:
    bpe = Tokenizer(models.BPE(unk_token="[UNK]"))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=3000, special_tokens=["[UNK]"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    bpe.train_from_iterator([tok.text(i, 300) for i in range(60)], trainer)
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    bpe.save(str(path))
    return HFVocabulary(path.parent)


@pytest.mark.parametrize("n", [1, 2, 7, 64, 1000])
def test_texts_have_exactly_the_requested_tokens(vocab, n):
    text = vocab.text(42, n)
    assert vocab.count(text) == n and text == vocab.text(42, n)
    assert vocab.count(vocab.truncate(text, n // 2)) == n // 2


def test_conversation_contents_are_sized_in_the_endpoints_tokens(vocab):
    rounds = [Round(new_input_tokens=300, output_tokens=20), Round(new_input_tokens=120, output_tokens=20),
              Round(new_input_tokens=200, output_tokens=20, prefix_tokens=250)]
    conv = Conversation(Session(session_id="s", start_s=0.0, rounds=rounds), vocab)
    for k in range(3):
        msgs = conv.prompt(k)
        assert all(vocab.count(m.text) == m.tokens for m in msgs)
        conv.reply(vocab.text(k, 20))


def test_bad_tokenizer_paths_are_clear_errors(tmp_path):
    with pytest.raises(CodaError, match="no tokenizer.json"):
        HFVocabulary(tmp_path)
    (tmp_path / "tokenizer.json").write_text("{not a tokenizer")
    with pytest.raises(CodaError, match="not a Hugging Face tokenizer file"):
        HFVocabulary(tmp_path)
