"""PEFT interop: adapters exported by fineflax load in peft on transformers with the same logits; merged
checkpoints load in transformers; import(export(x)) == x; malformed adapter folders fail clearly."""
from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch")
peft = pytest.importorskip("peft")
transformers = pytest.importorskip("transformers")

from fineflax.testing.hf_models import make_hf_model  # noqa: E402
from fineflax.lora import (LoraConfig, export_merged, export_peft, import_peft, init_lora,  # noqa: E402
                           lora_scale)
from fineflax.models import ModelConfig, forward, init_params, load  # noqa: E402
from fineflax.models.quantize import quantize_params  # noqa: E402

CASES = {  # family -> LoRA settings (the Qwen2 case: a subset of targets, HF names, rsLoRA)
    "llama": LoraConfig(r=4, alpha=8.0),
    "qwen2": LoraConfig(r=8, alpha=16.0, target_modules=("q_proj", "v_proj", "down_proj"), use_rslora=True),
    "gemma2": LoraConfig(r=4, alpha=8.0),
    # Phi-3's fused modules: all of qkv_proj (exported at rank 3r), only the gate half of gate_up_proj
    "phi3": LoraConfig(r=4, alpha=8.0, target_modules=("qkv_proj", "o_proj", "gate"), use_rslora=True),
}
TOKENS = np.random.default_rng(0).integers(0, 160, (2, 11))


@pytest.fixture(scope="module", params=sorted(CASES))
def case(request, tmp_path_factory):
  """(family, HF folder, fineflax params f32, config, lora with random non-zero b, lora cfg)."""
  family = request.param
  path = tmp_path_factory.mktemp(family) / "base"
  make_hf_model(family, path, seed=3)
  params, config, _ = load(path, with_tokenizer=False)
  cfg = CASES[family]
  lora = init_lora(params, config, cfg, jax.random.key(5))
  keys = iter(jax.random.split(jax.random.key(6), len(lora)))
  lora = {n: {"a": ab["a"], "b": 0.1 * jax.random.normal(next(keys), ab["b"].shape)} for n, ab in lora.items()}
  return family, path, params, config, lora, cfg


def _fineflax_logits(params, config, lora=None, scale=1.0):
  fwd = jax.jit(forward, static_argnums=1, static_argnames="lora_scale")
  return np.asarray(fwd(params, config, jnp.asarray(TOKENS), lora=lora, lora_scale=scale))


def _torch_logits(model):
  with torch.no_grad():
    return model(torch.from_numpy(TOKENS)).logits.float().numpy()


def test_peft_loads_exported_adapter_with_same_logits(case, tmp_path):
  family, base_dir, params, config, lora, cfg = case
  out = export_peft(lora, cfg, config, tmp_path / "adapter", base_model_name_or_path=str(base_dir))
  saved = json.loads((out / "adapter_config.json").read_text())
  assert saved["r"] == cfg.r and saved["use_rslora"] == cfg.use_rslora and saved["task_type"] == "CAUSAL_LM"
  model = transformers.AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32).eval()
  before = _torch_logits(model)
  model = peft.PeftModel.from_pretrained(model, out).eval()
  theirs = _torch_logits(model)
  ours = _fineflax_logits(params, config, lora, lora_scale(cfg))
  assert np.abs(theirs - before).max() > 1e-3  # the adapter really changes the model
  np.testing.assert_allclose(ours, theirs, atol=1e-4, rtol=0)


def test_import_of_export_is_identity(case, tmp_path):
  family, _, params, config, lora, cfg = case
  out = export_peft(lora, cfg, config, tmp_path / "adapter")
  lora2, cfg2 = import_peft(out, config)
  if family == "phi3":  # q, k, v come back as one rank-3r adapter each (shared a): same function
    saved = json.loads((out / "adapter_config.json").read_text())
    assert saved["target_modules"] == ["gate_up_proj", "o_proj", "qkv_proj"]
    assert saved["rank_pattern"] == {"qkv_proj": 3 * cfg.r} and cfg2.r == 3 * cfg.r
    assert set(lora2) == set(lora) | {"up"} and not np.asarray(lora2["up"]["b"]).any()  # gate_up's up half
    np.testing.assert_allclose(_fineflax_logits(params, config, lora2, lora_scale(cfg2)),
                               _fineflax_logits(params, config, lora, lora_scale(cfg)), atol=1e-5, rtol=0)
    return
  assert cfg2.r == cfg.r and cfg2.alpha == cfg.alpha and cfg2.use_rslora == cfg.use_rslora
  assert set(cfg2.target_modules) == set(lora)
  assert jax.tree_util.tree_structure(lora2) == jax.tree_util.tree_structure(lora)
  jax.tree_util.tree_map(lambda x, y: np.testing.assert_array_equal(np.asarray(x), np.asarray(y)), lora, lora2)


def test_merged_export_loads_in_transformers(case, tmp_path):
  family, _, params, config, lora, cfg = case
  vocab = {f"t{i}": i for i in range(config.vocab_size)}
  tok = transformers.PreTrainedTokenizerFast(
      tokenizer_object=__import__("tokenizers").Tokenizer(
          __import__("tokenizers").models.WordLevel(vocab, unk_token="t0")))
  out = export_merged(params, lora, cfg, config, tok, tmp_path / "merged")
  assert (out / "tokenizer.json").exists() and not list(out.glob(".*"))
  model = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
  ours = _fineflax_logits(params, config, lora, lora_scale(cfg))
  np.testing.assert_allclose(_torch_logits(model), ours, atol=1e-4, rtol=0)
  assert transformers.AutoTokenizer.from_pretrained(out).convert_tokens_to_ids("t7") == 7
  if family in ("llama", "gemma2", "phi3"):  # an NF4 base is dequantised on export, then merged
    q = quantize_params(params)
    out_q = export_merged(q, lora, cfg, config, None, tmp_path / "merged_nf4")
    model = transformers.AutoModelForCausalLM.from_pretrained(out_q, dtype=torch.float32).eval()
    np.testing.assert_allclose(_torch_logits(model), _fineflax_logits(q, config, lora, lora_scale(cfg)),
                               atol=1e-4, rtol=0)


def test_import_errors(tmp_path):
  config = ModelConfig(vocab_size=32, hidden_size=64, intermediate_size=96, num_layers=2, num_heads=4,
                       num_kv_heads=2, head_dim=16)
  cfg = LoraConfig(r=4, alpha=8.0)
  lora = init_lora(init_params(config, jax.random.key(0)), config, cfg, jax.random.key(1))
  with pytest.raises(FileNotFoundError, match="no adapter_config.json"):
    import_peft(tmp_path, config)
  out = export_peft(lora, cfg, config, tmp_path / "a")
  raw = json.loads((out / "adapter_config.json").read_text())
  (out / "adapter_config.json").write_text(json.dumps({**raw, "use_dora": True}))
  with pytest.raises(ValueError, match=r"adapter_config.json: field use_dora=True is not supported"):
    import_peft(out, config)
  (out / "adapter_config.json").write_text(json.dumps(raw))
  from fineflax.models.safetensors_io import read_safetensors, write_safetensors
  tensors = dict(read_safetensors(out / "adapter_model.safetensors"))
  dropped = {k: v for k, v in tensors.items() if "layers.1.self_attn.q_proj.lora_B" not in k}
  write_safetensors(dropped, out / "adapter_model.safetensors")
  with pytest.raises(ValueError, match=r"self_attn.q_proj.lora_B missing for layers \[1\]"):
    import_peft(out, config)
  write_safetensors({**tensors, "base_model.model.lm_head.weight": np.zeros((2, 2), np.float32)},
                    out / "adapter_model.safetensors")
  with pytest.raises(ValueError, match=r"unexpected tensor 'base_model.model.lm_head.weight'"):
    import_peft(out, config)
  bad = dict(tensors)
  key = "base_model.model.model.layers.0.mlp.up_proj.lora_A.weight"
  bad[key] = np.zeros((cfg.r, 7), np.float32)
  write_safetensors(bad, out / "adapter_model.safetensors")
  with pytest.raises(ValueError, match=r"up_proj.lora_A.weight' has shape \(4, 7\); expected \(4, 64\)"):
    import_peft(out, config)
