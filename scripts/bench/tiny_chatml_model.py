"""A tiny random Llama (head_dim 64, so the CUDA attention kernels take it) with a byte-level BPE
tokenizer trained on the shipped dialogues and a ChatML template: a model with a real tokenizer
for GPU checks on a machine that cannot reach the Hub.

  python3 scripts/bench/tiny_chatml_model.py OUT_DIR
"""
import json
import sys

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM

out = sys.argv[1]
texts = []
with open("datasets/customer-service-v1/train.jsonl") as f:
    for line in f:
        texts += [m["content"] for m in json.loads(line)["messages"]]
specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
tok = Tokenizer(models.BPE())
tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
tok.decoder = decoders.ByteLevel()
tok.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=1024, special_tokens=specials,
                                                   initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
torch.manual_seed(0)
config = LlamaConfig(vocab_size=tok.get_vocab_size(), hidden_size=256, intermediate_size=688, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                     bos_token_id=1, eos_token_id=2, tie_word_embeddings=False)
LlamaForCausalLM(config).to(torch.float16).save_pretrained(out)
tok.save(f"{out}/tokenizer.json")
template = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
            "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
with open(f"{out}/tokenizer_config.json", "w") as f:
    json.dump({"chat_template": template, "bos_token": None, "eos_token": "<|im_end|>",
               "pad_token": "<|endoftext|>", "tokenizer_class": "PreTrainedTokenizerFast"}, f)
print(f"wrote {out}: vocab {tok.get_vocab_size()}")
