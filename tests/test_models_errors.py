"""Bad model input: each failure names the culprit (file, tensor, field or value)."""
import json

import numpy as np
import pytest

from fineflax.testing.hf_models import make_hf_model
from fineflax.models import load, load_numpy
from fineflax.models.safetensors_io import read_safetensors, write_safetensors


def test_missing_folder_and_config(tmp_path):
  with pytest.raises(FileNotFoundError, match="no such file or folder"):
    load_numpy(tmp_path / "nope")
  (tmp_path / "empty").mkdir()
  with pytest.raises(FileNotFoundError, match="no config.json"):
    load_numpy(tmp_path / "empty")


def test_unsupported_architecture(tmp_path):
  make_hf_model("llama", tmp_path)
  cfg = json.loads((tmp_path / "config.json").read_text())
  cfg["model_type"] = "gpt2"
  (tmp_path / "config.json").write_text(json.dumps(cfg))
  with pytest.raises(ValueError, match=r"config.json: unsupported architecture model_type='gpt2'"):
    load_numpy(tmp_path)


def test_missing_config_field(tmp_path):
  make_hf_model("llama", tmp_path)
  cfg = json.loads((tmp_path / "config.json").read_text())
  del cfg["intermediate_size"]
  (tmp_path / "config.json").write_text(json.dumps(cfg))
  with pytest.raises(ValueError, match="missing field 'intermediate_size'"):
    load_numpy(tmp_path)


def test_corrupt_and_truncated_safetensors(tmp_path):
  make_hf_model("llama", tmp_path)
  f = tmp_path / "model.safetensors"
  data = f.read_bytes()
  f.write_bytes(data[: len(data) // 2])
  with pytest.raises(ValueError, match="model.safetensors.*truncated"):
    load_numpy(tmp_path)
  f.write_bytes(b"\x05\x00\x00\x00\x00\x00\x00\x00{oops")
  with pytest.raises(ValueError, match="not a readable safetensors file"):
    load_numpy(tmp_path)


def test_missing_tensor_is_named(tmp_path):
  make_hf_model("llama", tmp_path)
  f = tmp_path / "model.safetensors"
  sd = {k: np.array(v) for k, v in read_safetensors(f).items()}
  del sd["model.layers.1.mlp.up_proj.weight"]
  write_safetensors(sd, f)
  with pytest.raises(KeyError, match="layers.1.mlp.up_proj.weight"):
    load_numpy(tmp_path)


def test_shape_mismatch_is_named(tmp_path):
  make_hf_model("llama", tmp_path)
  cfg = json.loads((tmp_path / "config.json").read_text())
  cfg["vocab_size"] = 999
  (tmp_path / "config.json").write_text(json.dumps(cfg))
  with pytest.raises(ValueError, match=r"embed has shape \(160, 64\), config expects \(999, 64\)"):
    load_numpy(tmp_path)


def test_tokenizer_vocab_mismatch(tmp_path):
  from fineflax.models.load import load_tokenizer
  tok = load_tokenizer("smollm2-135m-instruct")  # the bundled copy: no need to load the 135M GGUF's weights
  make_hf_model("llama", tmp_path)  # vocab 160, far smaller than SmolLM2's tokenizer
  tok.save_pretrained(tmp_path)
  with pytest.raises(ValueError, match="tokenizer has 49152 tokens but the model's vocabulary is 160"):
    load(tmp_path)


def test_gguf_unsupported_quant_type(tmp_path):
  import gguf
  path = tmp_path / "bad.gguf"
  w = gguf.GGUFWriter(str(path), "llama")
  w.add_block_count(1)
  w.add_embedding_length(32)
  w.add_feed_forward_length(64)
  w.add_head_count(2)
  w.add_head_count_kv(2)
  w.add_vocab_size(8)
  # IQ2_XXS: 66 bytes a block of 256 values
  w.add_tensor("token_embd.weight", np.zeros((8, 66), np.uint8),
               raw_dtype=gguf.GGMLQuantizationType.IQ2_XXS)
  w.write_header_to_file()
  w.write_kv_data_to_file()
  w.write_tensors_to_file()
  w.close()
  with pytest.raises(ValueError, match=r"token_embd.weight has quant type IQ2_XXS; supported: F32, F16"):
    load_numpy(path)


def test_gguf_corrupt_file(tmp_path):
  path = tmp_path / "corrupt.gguf"
  path.write_bytes(b"GGUF" + b"\x00" * 10)
  with pytest.raises(ValueError, match="corrupt.gguf: not a readable GGUF file"):
    load_numpy(path)


def test_unknown_alias(tmp_path):
  with pytest.raises(FileNotFoundError, match="not a known alias"):
    load_numpy("smollm9-1t")


def _edit_config(path, **changes):
  cfg = json.loads((path / "config.json").read_text())
  cfg.update(changes)
  (path / "config.json").write_text(json.dumps(cfg))


def test_extra_tensor_is_refused_but_rotary_buffers_pass(tmp_path):
  make_hf_model("llama", tmp_path)
  f = tmp_path / "model.safetensors"
  sd = {k: np.array(v) for k, v in read_safetensors(f).items()}
  sd["model.layers.0.self_attn.rotary_emb.inv_freq"] = np.ones(8, np.float32)  # known unused buffer
  write_safetensors(sd, f)
  load_numpy(tmp_path)
  sd["model.layers.1.self_attn.o_proj.bias"] = np.zeros(64, np.float32)
  write_safetensors(sd, f)
  with pytest.raises(ValueError, match=r"1 checkpoint tensor\(s\) not used.*layers.1.self_attn.o_proj.bias"):
    load_numpy(tmp_path)


@pytest.mark.parametrize("changes, message", [
    ({"logit_scale": 2.0}, r"field logit_scale=2.0 is not understood by fineflax for model_type 'llama'"),
    ({"quantization_config": {"quant_method": "gptq"}}, r"field quantization_config="),
    ({"hidden_act": "swiglu"}, r"hidden_act='swiglu' is not supported"),
    ({"rope_parameters": {"rope_type": "longrope", "rope_theta": 1e4}},
     r"rope_parameters.rope_type='longrope' is not supported"),
    ({"rope_parameters": {"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.5}},
     r"partial_rotary_factor=0.5"),
    ({"sliding_window": 8}, r"field sliding_window=8 is not understood by fineflax for model_type 'llama'"),
    ({"use_cache": True, "pretraining_tp": 1, "attention_dropout": 0.1, "unknown_flag": False,
      "is_llama_config": True, "rope_interleaved": False,  # as in SmolLM2's config.json
      "transformers.js_config": {"kv_cache_dtype": {"q4f16": "float16"}}}, None),
    ({"rope_interleaved": True}, r"field rope_interleaved=True is not understood"),
])
def test_math_changing_config_fields_are_refused_at_load(tmp_path, changes, message):
  make_hf_model("llama", tmp_path)
  _edit_config(tmp_path, **changes)
  if message is None:  # bookkeeping / training-only fields and empty values pass
    load_numpy(tmp_path)
    return
  with pytest.raises(ValueError, match=message):
    load_numpy(tmp_path)
  from fineflax.models import load_config
  with pytest.raises(ValueError, match=message):  # the config alone (--dry_run) already refuses
    load_config(tmp_path)


def test_gguf_truncated_file_says_expected_and_found_bytes(tmp_path):
  """A tiny GGUF with the real SmolLM2 file's tensor types (F32, Q4_1, Q8_0; parsing the real file's
  49k-token vocabulary twice took ~20 s): cut in half, it names the bytes its tensor table needs."""
  import re
  import gguf
  from fineflax.models import load_config
  src = tmp_path / "whole.gguf"
  w = gguf.GGUFWriter(str(src), "llama")
  w.add_block_count(1)
  rng = np.random.default_rng(0)
  w.add_tensor("token_embd.weight", rng.standard_normal((8, 64)).astype(np.float32))
  for name, kind in (("blk.0.attn_q.weight", gguf.GGMLQuantizationType.Q4_1),
                     ("output.weight", gguf.GGMLQuantizationType.Q8_0)):  # 64 x 64: 128 blocks of 32
    block, type_size = gguf.GGML_QUANT_SIZES[kind]
    w.add_tensor(name, rng.integers(0, 255, (64, 64 // block * type_size), dtype=np.uint8), raw_dtype=kind)
  w.write_header_to_file()
  w.write_kv_data_to_file()
  w.write_tensors_to_file()
  w.close()
  size = src.stat().st_size
  cut = tmp_path / "cut.gguf"
  cut.write_bytes(src.read_bytes()[:size // 2])
  with pytest.raises(ValueError, match=rf"cut.gguf: truncated: expected \d+ bytes, found {size // 2}") as e:
    load_numpy(cut)
  expected = int(re.search(r"expected (\d+) bytes", str(e.value)).group(1))
  # the last tensor (Q8_0: 34 bytes per 32 weights) ends the data; only alignment padding may follow it
  assert size - 32 < expected <= size, (expected, size)
  with pytest.raises(ValueError, match="truncated: expected"):
    load_config(cut)  # --dry_run reads the same tensor table


def _tiny_gguf(path, kv=(), extra=()):
  """A 1-layer F32 llama GGUF (random weights) with extra metadata `kv` and tensors `extra`."""
  import gguf
  rng = np.random.default_rng(0)
  w = gguf.GGUFWriter(str(path), "llama")
  for add, v in ((w.add_block_count, 1), (w.add_embedding_length, 32), (w.add_feed_forward_length, 48),
                 (w.add_head_count, 2), (w.add_head_count_kv, 2), (w.add_vocab_size, 8)):
    add(v)
  for key, value in kv:
    w.add_string(key, value) if isinstance(value, str) else w.add_uint32(key, value)
  shapes = {"token_embd.weight": (8, 32), "output_norm.weight": (32,), "blk.0.attn_norm.weight": (32,),
            "blk.0.ffn_norm.weight": (32,), "blk.0.attn_q.weight": (32, 32), "blk.0.attn_k.weight": (32, 32),
            "blk.0.attn_v.weight": (32, 32), "blk.0.attn_output.weight": (32, 32),
            "blk.0.ffn_gate.weight": (48, 32), "blk.0.ffn_up.weight": (48, 32),
            "blk.0.ffn_down.weight": (32, 48), **dict(extra)}
  for name, shape in shapes.items():
    w.add_tensor(name, rng.standard_normal(shape).astype(np.float32))
  w.write_header_to_file()
  w.write_kv_data_to_file()
  w.write_tensors_to_file()
  w.close()
  return path


def test_gguf_strict_metadata_and_tensors(tmp_path):
  params, config = load_numpy(_tiny_gguf(tmp_path / "ok.gguf"))
  assert config.num_layers == 1 and config.tie_word_embeddings
  with pytest.raises(ValueError, match=r"GGUF metadata llama.rope.scaling.type='yarn' is not supported"):
    load_numpy(_tiny_gguf(tmp_path / "yarn.gguf", kv=[("llama.rope.scaling.type", "yarn")]))
  with pytest.raises(ValueError, match=r"llama.attention.sliding_window=8 is not supported"):
    load_numpy(_tiny_gguf(tmp_path / "swa.gguf", kv=[("llama.attention.sliding_window", 8)]))
  with pytest.raises(ValueError, match=r"rope_freqs.weight .*not supported from GGUF"):
    load_numpy(_tiny_gguf(tmp_path / "rf.gguf", extra=[("rope_freqs.weight", (8,))]))
  with pytest.raises(ValueError, match=r"not used by the llama import.*blk.0.attn_sinks.weight"):
    load_numpy(_tiny_gguf(tmp_path / "x.gguf", extra=[("blk.0.attn_sinks.weight", (2,))]))


def test_explicit_null_fields_keep_their_meaning():
  from fineflax.models import ModelConfig
  base = dict(model_type="gemma2", vocab_size=8, hidden_size=16, intermediate_size=8, num_hidden_layers=2,
              num_attention_heads=2)
  c = ModelConfig.from_hf(base)  # omitted: transformers' Gemma2Config defaults
  assert (c.final_logit_softcapping, c.attn_logit_softcapping, c.sliding_window) == (30.0, 50.0, 4096)
  c = ModelConfig.from_hf({**base, "final_logit_softcapping": None, "sliding_window": None,
                           "rope_theta": None})  # null: no cap, no window; null rope_theta: the default
  assert (c.final_logit_softcapping, c.sliding_window, c.layer_types, c.rope_theta) == (None, None, (), 1e4)


@pytest.mark.fast
def test_a_low_bit_gguf_requantised_to_nf4_gets_a_note(tmp_path):
  """The bundled Q4_1 SmolLM2 file is named with its type; an F32 GGUF and an HF folder get no note."""
  from fineflax.models.gguf_import import low_bit_layer_types
  from fineflax.models.load import requantisation_note, resolve_source
  assert low_bit_layer_types(resolve_source("smollm2-135m-instruct")) == ["Q4_1"]
  note = requantisation_note("smollm2-135m-instruct")
  assert note.startswith("note: SmolLM2-135M-Instruct.Q4_1.gguf already holds Q4_1 weights") and "int8" in note
  assert requantisation_note(_tiny_gguf(tmp_path / "f32.gguf")) is None
  make_hf_model("llama", tmp_path / "hf", num_hidden_layers=1)
  assert requantisation_note(tmp_path / "hf") is None
