"""The sampler on the real SmolLM2-135M-Instruct: greedy parity with transformers, chat, EOS, stops."""
from __future__ import annotations

import copy

import jax.numpy as jnp
import numpy as np
import pytest
import torch

from _sampling_fixtures import hf_greedy
from fineflax.sampling import chat_prompt_ids, format_chat, generate

# One xdist worker runs this file's tests: only it loads the 135M GGUF (the session smollm2 fixture, ~8 s).
pytestmark = pytest.mark.xdist_group("smollm2")

MESSAGES = [[{"role": "system", "content": "You are a helpful assistant."},
             {"role": "user", "content": "What is the capital of France?"}],
            [{"role": "user", "content": "Name three colors."}]]


def _prompts(tok):
  return [chat_prompt_ids(tok, m) for m in MESSAGES]


def test_format_chat_uses_the_template_and_falls_back_to_chatml(smollm2):
  _, _, tok = smollm2
  chatml = ("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
            "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n")
  assert format_chat(tok, MESSAGES[0]) == chatml
  assert format_chat(tok, MESSAGES[0], add_generation_prompt=False) == chatml[:-len("<|im_start|>assistant\n")]
  # SmolLM2's template injects its default system prompt; plain ChatML does not.
  assert "SmolLM" in format_chat(tok, MESSAGES[1])
  bare = copy.copy(tok)
  bare.chat_template = None
  assert format_chat(bare, MESSAGES[1]) == ("<|im_start|>user\nName three colors.<|im_end|>\n"
                                            "<|im_start|>assistant\n")
  with pytest.raises(ValueError, match=r"messages\[0\]"):
    format_chat(tok, [{"content": "no role"}])


def test_chat_prompt_ids_are_the_templates_generation_prompt_then_the_prefill(smollm2):
  _, _, tok = smollm2
  for m in MESSAGES:  # transformers' own tokenized render of the template
    assert chat_prompt_ids(tok, m) == list(tok.apply_chat_template(m, add_generation_prompt=True, tokenize=True,
                                                                   return_dict=False))
  prefilled = chat_prompt_ids(tok, MESSAGES[0], "<think>\n")
  assert prefilled == tok(format_chat(tok, MESSAGES[0]) + "<think>\n", add_special_tokens=False)["input_ids"]
  assert prefilled[:len(chat_prompt_ids(tok, MESSAGES[0]))] == chat_prompt_ids(tok, MESSAGES[0])


def test_smollm2_greedy_matches_transformers_on_the_same_weights(smollm2):
  from transformers import LlamaConfig, LlamaForCausalLM
  from transformers.initialization import no_init_weights
  from fineflax.models.hf_import import state_dict_from_params
  params, config, tok = smollm2
  with no_init_weights():
    model = LlamaForCausalLM(LlamaConfig(**config.to_hf())).eval()
  sd = {k: torch.tensor(v) for k, v in state_dict_from_params(params, config).items()}
  missing = model.load_state_dict(sd, strict=False).missing_keys
  assert missing == ["lm_head.weight"], missing
  model.tie_weights()
  prompts = _prompts(tok)
  assert len(prompts[0]) != len(prompts[1])
  ref = hf_greedy(model, prompts, 32)
  out = generate(params, config, prompts, max_new_tokens=32, temperature=0.0, tokenizer=tok,
                 dtype=jnp.float32, stop_strings=("capital of",))
  # Row 1 ends at <|im_end|> (the tokenizer's EOS): token-identical to transformers up to and after it.
  im_end = tok.convert_tokens_to_ids("<|im_end|>")
  np.testing.assert_array_equal(out.tokens[1], ref[1])
  assert out.finish_reason[1] == "eos" and ref[1, out.lengths[1] - 1] == im_end
  assert out.texts[1] == tok.decode(ref[1], skip_special_tokens=True)
  # Row 0 ("The capital of France is Paris.") stops at the stop string: a prefix of transformers' row.
  n = out.lengths[0]
  assert out.finish_reason[0] == "stop" and out.texts[0] == "The capital of", out.texts
  np.testing.assert_array_equal(out.tokens[0, :n], ref[0, :n])
  assert tok.decode(ref[0, :n - 1]) == "The capital" and not out.mask[0, n:].any()
  assert tok.decode(ref[0, :list(ref[0]).index(im_end)]) == "The capital of France is Paris."


def test_smollm2_gguf_matches_transformers_loading_the_gguf(smollm2):
  """One load of the GGUF by transformers' own loader (~25 s) checks the importer (config, last-token
  logits of a chat prompt, f32) and the sampler (greedy tokens) against it."""
  import jax
  from transformers import AutoModelForCausalLM
  from fineflax.models import forward
  from fineflax.models.load import resolve_source
  params, config, tok = smollm2
  assert (config.num_layers, config.hidden_size, config.num_heads, config.num_kv_heads) == (30, 576, 9, 3)
  assert config.tie_word_embeddings and config.rope_theta == 100000.0
  path = resolve_source("smollm2-135m-instruct")
  model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                               dtype=torch.float32).eval()
  text = tok.apply_chat_template([{"role": "user", "content": "Name three prime numbers."}],
                                 add_generation_prompt=True, tokenize=False)
  ids = tok(text)["input_ids"]
  with torch.no_grad():
    ref = model(torch.tensor([ids])).logits[0, -1].numpy()
  logits = np.asarray(jax.jit(lambda p, t: forward(p, config, t))(params, jnp.asarray([ids])))[0, -1]
  rel = np.linalg.norm(logits - ref) / np.linalg.norm(ref)
  assert rel <= 1e-3, rel
  assert int(logits.argmax()) == int(ref.argmax())
  prompts = _prompts(tok)
  out = generate(params, config, prompts, max_new_tokens=32, temperature=0.0, dtype=jnp.float32)
  np.testing.assert_array_equal(out.tokens, hf_greedy(model, prompts, 32))
