"""The bundled SmolLM2 tokenizer equals transformers' conversion of the GGUF (ids and chat template)."""
from transformers import AutoTokenizer

from fineflax.models import load_tokenizer
from fineflax.models.load import resolve_source

TEXTS = ["Hello, world!", "What is 17 + 25? 17 + 25 = 42.", "  leading spaces\tand tabs\n\nnew lines",
         "naïve café — unicode ✓ 日本語", "<think>Step 1: 3 * 4 = 12</think><answer>12</answer>",
         "<|im_start|>user\nhi<|im_end|>", "def f(x):\n    return x ** 2  # code"]


def test_bundled_tokenizer_equals_gguf_conversion():
  bundled = load_tokenizer("smollm2-135m-instruct")
  gguf = resolve_source("smollm2-135m-instruct")
  ref = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
  assert len(bundled) == len(ref) == 49152
  for t in TEXTS:
    assert bundled(t)["input_ids"] == ref(t)["input_ids"], t
  messages = [{"role": "user", "content": "Name a prime."}, {"role": "assistant", "content": "7."}]
  assert bundled.apply_chat_template(messages, tokenize=False) == ref.apply_chat_template(messages, tokenize=False)
  assert (bundled.eos_token, bundled.bos_token, bundled.pad_token) == (ref.eos_token, ref.bos_token, ref.pad_token)
