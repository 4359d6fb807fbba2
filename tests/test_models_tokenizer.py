"""The bundled SmolLM2 tokenizer equals transformers' conversion of the GGUF (ids and chat template);
load_tokenizer on a folder equals AutoTokenizer."""
import json
import subprocess
import sys

import pytest
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


MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a prime."},
            {"role": "assistant", "content": "7."}, {"role": "user", "content": "Another?"}]


@pytest.mark.parametrize("model_type,tokenizer_class", [
    (None, "TokenizersBackend"), ("llama", "PreTrainedTokenizerFast"), ("mistral", "TokenizersBackend"),
    ("qwen2", "TokenizersBackend"), ("qwen3", "PreTrainedTokenizerFast"), ("gemma2", "TokenizersBackend"),
    ("gemma3", "TokenizersBackend"), ("gemma3_text", "TokenizersBackend"), ("phi3", "TokenizersBackend"),
    ("llama", "LlamaTokenizer")])
def test_folder_tokenizer_equals_auto_tokenizer(tmp_path, model_type, tokenizer_class):
  """load_tokenizer(folder) skips AutoTokenizer (and its torch import) for generic fast tokenizers: the
  same class, ids, special tokens and chat template as AutoTokenizer for each model type (phi3, qwen2 and
  a model-specific class go through AutoTokenizer)."""
  load_tokenizer("smollm2-135m-instruct").save_pretrained(tmp_path)
  cfg = json.loads((tmp_path / "tokenizer_config.json").read_text())
  (tmp_path / "tokenizer_config.json").write_text(json.dumps({**cfg, "tokenizer_class": tokenizer_class}))
  if model_type:
    (tmp_path / "config.json").write_text(json.dumps({"model_type": model_type}))
  ours, ref = load_tokenizer(tmp_path), AutoTokenizer.from_pretrained(str(tmp_path))
  assert type(ours) is type(ref) and len(ours) == len(ref) == 49152
  for t in TEXTS:
    assert ours(t)["input_ids"] == ref(t)["input_ids"], t
    assert ours(t, add_special_tokens=False)["input_ids"] == ref(t, add_special_tokens=False)["input_ids"], t
  for gen in (False, True):
    assert ours.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=gen) == \
        ref.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=gen)
  assert ours.special_tokens_map == ref.special_tokens_map and ours.all_special_ids == ref.all_special_ids
  assert (ours.padding_side, ours.truncation_side, ours.model_max_length) == (
      ref.padding_side, ref.truncation_side, ref.model_max_length)
  assert ours.decode(ref(TEXTS[3])["input_ids"]) == ref.decode(ref(TEXTS[3])["input_ids"])


def test_folder_tokenizer_does_not_import_torch(tiny_smol):
  code = ("import sys; from fineflax.models.load import load_tokenizer; "
          f"tok = load_tokenizer({tiny_smol!r}); print(len(tok), 'torch' in sys.modules)")
  r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
  assert r.returncode == 0 and r.stdout.split() == ["49152", "False"], r.stdout + r.stderr[-2000:]
