"""Create a tiny random Llama and a small byte-level BPE tokenizer (run with vLLM's Python).

No model can be downloaded here, so the real-engine tests build one: 2 layers, hidden 256,
4 heads of dim 64 (the CPU attention kernel rejects head_dim 16), a 1,000-token vocabulary.
"""

import sys
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

out = Path(sys.argv[1])
out.mkdir(parents=True, exist_ok=True)
tok = Tokenizer(models.BPE(unk_token="<unk>"))
tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
tok.decoder = decoders.ByteLevel()
corpus = " ".join(f"word{i} tool{i % 50} file{i % 97}.py def return import class result" for i in range(3000))
trainer = trainers.BpeTrainer(
    vocab_size=1000, special_tokens=["<unk>", "<s>", "</s>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
)
tok.train_from_iterator([corpus] * 3, trainer)
hf = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>")
hf.chat_template = (
    "{% for m in messages %}<s>{{ m['role'] }}: {{ m['content'] if m['content'] is string else '' }}\n{% endfor %}"
    "{% if add_generation_prompt %}<s>assistant: {% endif %}"
)
hf.save_pretrained(out)
cfg = LlamaConfig(
    vocab_size=len(hf),
    hidden_size=256,
    intermediate_size=512,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=4,
    head_dim=64,
    max_position_embeddings=8192,
    bos_token_id=1,
    eos_token_id=2,
)
torch.manual_seed(0)
LlamaForCausalLM(cfg).save_pretrained(out)
print(out)
