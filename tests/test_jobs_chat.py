"""The chat job: base model, with a PEFT adapter from disk, and with a memory-store system prompt."""
import jax
import numpy as np
import pytest

from fineflax.jobs.resolve import load_config
from fineflax import lora as L
from fineflax.jobs import chat
from fineflax.models import load
from fineflax.sampling import format_chat, generate


def _config(source, **kw):
  c = load_config("configs/chat.py")
  c.model.source = source
  c.prompt = "What is 2 + 3?"
  c.sampling.max_new_tokens = 6
  for k, v in kw.items():
    setattr(c, k, v) if "." not in k else setattr(c[k.split(".")[0]], k.split(".")[1], v)
  return c


@pytest.mark.long
def test_chat_with_adapter_matches_generate_with_that_adapter(tiny_smol, tmp_path, capsys):
  params, config, tok = load(tiny_smol)
  cfg = L.LoraConfig(r=4, alpha=8.0)
  lora = L.init_lora(params, config, cfg, jax.random.PRNGKey(0))
  lora = jax.tree.map(lambda x: x + 0.2 * jax.random.normal(jax.random.PRNGKey(3), x.shape), lora)
  L.export_peft(lora, cfg, config, tmp_path / "adapter")
  c = _config(tiny_smol, **{"model.adapter": str(tmp_path / "adapter")})
  text = chat.run(c, None)
  assert text in capsys.readouterr().out
  ids = tok(format_chat(tok, [{"role": "user", "content": c.prompt}]), add_special_tokens=False)["input_ids"]
  ref = generate(params, config, [ids], max_new_tokens=6, temperature=0.0, tokenizer=tok, lora=lora,
                 lora_scale=L.lora_scale(cfg), dtype=np.float32)
  plain = generate(params, config, [ids], max_new_tokens=6, temperature=0.0, tokenizer=tok,
                   dtype=np.float32)
  assert text == ref.texts[0] and ref.texts[0] != plain.texts[0]


def test_memory_store_context_reaches_the_system_prompt(tiny_smol, tmp_path, monkeypatch, capsys):
  from memory.hashing import HashingEmbedding
  from memory.store import VectorStore
  col = VectorStore(tmp_path / "store").get_or_create_collection("default", HashingEmbedding(64))
  col.upsert(ids=["a"], documents=["Zorblat prime numbers are listed in the Varnholm archive."])
  seen = {}
  from fineflax.sampling import answer as answer_module
  real = answer_module.chat_prompt_ids
  def spy(tok, messages, **kw):
    seen["messages"] = messages
    return real(tok, messages, **kw)
  monkeypatch.setattr(answer_module, "chat_prompt_ids", spy)
  monkeypatch.setattr(chat, "memory_embedding", lambda: HashingEmbedding(64))
  c = _config(tiny_smol, prompt="Where are Zorblat prime numbers listed?", memory_store=str(tmp_path / "store"),
              sop_folder="memory/sops")
  chat.run(c, None)
  assert seen["messages"][0]["role"] == "system"
  assert "Varnholm archive" in seen["messages"][0]["content"]
  assert "[system prompt" not in capsys.readouterr().out  # quiet unless verbose
  c.verbose = True
  chat.run(c, None)
  assert "Varnholm archive" in capsys.readouterr().out.split("[answer]")[0]
  c = _config(tiny_smol, prompt="My training run fails with a NaN loss, how do I debug it?",
              sop_folder="memory/sops")
  chat.run(c, None)
  assert "Follow this procedure step by step" in seen["messages"][0]["content"]
