"""GGUF files (llama.cpp) -> HF-named NumPy state dict + ModelConfig, through the `gguf` package."""
from __future__ import annotations

import pathlib

import numpy as np

from fineflax.models.config import ModelConfig
from fineflax.models.hf_import import params_from_state_dict

SUPPORTED_QUANT_TYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q6_K", "Q4_K",
                         "Q5_K", "Q8_K")
# <= 5 bits a weight: re-quantising such a file's linears to NF4 rounds them a second time, onto another grid
LOW_BIT_TYPES = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q5_K")
_ARCH_TO_MODEL_TYPE = {"llama": "llama", "mistral": "llama", "qwen2": "qwen2", "qwen3": "qwen3"}
_TENSOR_NAMES = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
                 "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
                 "ffn_down": "mlp.down_proj", "attn_norm": "input_layernorm",
                 "ffn_norm": "post_attention_layernorm", "attn_q_norm": "self_attn.q_norm",
                 "attn_k_norm": "self_attn.k_norm"}


def _field(reader, key, default=None):
  f = reader.fields.get(key)
  return default if f is None else f.contents()


# `{arch}.*` metadata the import understands; any other (rope scaling, sliding windows, experts, ...) with a
# non-empty value is refused rather than ignored
_KNOWN_KEYS = {"block_count", "context_length", "embedding_length", "feed_forward_length",
               "attention.head_count", "attention.head_count_kv", "attention.key_length",
               "attention.value_length", "attention.layer_norm_rms_epsilon", "rope.freq_base",
               "rope.dimension_count", "vocab_size"}


def hf_config_from_gguf(reader, path: str) -> dict:
  """The transformers config.json dict implied by GGUF metadata; metadata that would change the math and
  is not implemented raises, naming the key."""
  arch = _field(reader, "general.architecture")
  if arch not in _ARCH_TO_MODEL_TYPE:
    raise ValueError(f"{path}: unsupported GGUF architecture {arch!r}; "
                     f"supported: {', '.join(_ARCH_TO_MODEL_TYPE)}")
  g = lambda k, d=None: _field(reader, f"{arch}.{k}", d)
  for key in reader.fields:
    if key.startswith(f"{arch}.") and key[len(arch) + 1:] not in _KNOWN_KEYS:
      value = _field(reader, key)
      if value not in (None, 0, False, "", "none", []):
        raise ValueError(f"{path}: GGUF metadata {key}={value!r} is not supported by the fineflax GGUF "
                         "import; refusing to load rather than ignore it")
  names = {t.name for t in reader.tensors}
  vocab = g("vocab_size") or len(_field(reader, "tokenizer.ggml.tokens", []))
  heads = int(g("attention.head_count"))
  hidden = int(g("embedding_length"))
  hf = {"model_type": _ARCH_TO_MODEL_TYPE[arch], "vocab_size": int(vocab), "hidden_size": hidden,
        "intermediate_size": int(g("feed_forward_length")), "num_hidden_layers": int(g("block_count")),
        "num_attention_heads": heads, "num_key_value_heads": int(g("attention.head_count_kv", heads)),
        "head_dim": int(g("attention.key_length", hidden // heads)),
        "rms_norm_eps": float(g("attention.layer_norm_rms_epsilon", 1e-6)),
        "rope_theta": float(g("rope.freq_base", 10000.0)),
        "max_position_embeddings": int(g("context_length", 4096)),
        "tie_word_embeddings": "output.weight" not in names,
        "bos_token_id": _field(reader, "tokenizer.ggml.bos_token_id"),
        "eos_token_id": _field(reader, "tokenizer.ggml.eos_token_id"),
        "pad_token_id": _field(reader, "tokenizer.ggml.padding_token_id")}
  if arch == "qwen2":
    hf["attention_bias"] = True
  head_dim = hf["head_dim"]
  for key in ("rope.dimension_count", "attention.value_length"):
    if g(key) is not None and int(g(key)) != head_dim:
      raise ValueError(f"{path}: GGUF metadata {arch}.{key}={g(key)} differs from the head size {head_dim} "
                       "(partial rotary / unequal value heads are not supported)")
  if "rope_freqs.weight" in names:
    raise ValueError(f"{path}: tensor rope_freqs.weight (llama.cpp's form of Llama 3.1 rope scaling) is "
                     "not supported from GGUF; load the Hugging Face checkpoint folder instead")
  return hf


def _unpermute(w: np.ndarray, n_head: int) -> np.ndarray:
  """Undoes llama.cpp's rotary reordering of q/k rows (interleaved -> half-split)."""
  return w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def open_gguf(path: str | pathlib.Path):
  """A `gguf.GGUFReader` of `path`; a file shorter than its tensor table says raises
  "truncated: expected N bytes, found M", other unreadable files "not a readable GGUF file"."""
  import gguf

  class _Truncated(Exception):
    pass

  class _CheckedReader(gguf.GGUFReader):
    def _build_tensors(self, start_offs, fields):
      need = 0
      for field in fields:
        dims, raw_dtype, offset = field.parts[3], field.parts[4], field.parts[5]
        block, type_size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(int(raw_dtype[0]))]
        n_bytes = int(np.prod(dims.astype(np.int64))) * type_size // block
        need = max(need, int(start_offs) + int(offset[0]) + n_bytes)
      if need > len(self.data):
        raise _Truncated(need, len(self.data))
      super()._build_tensors(start_offs, fields)

  try:
    return _CheckedReader(str(path))
  except _Truncated as e:
    raise ValueError(f"{path}: truncated: expected {e.args[0]} bytes, found {e.args[1]} (the tensor "
                     "table needs more data than the file holds; re-download or re-convert it)") from None
  except Exception as e:  # gguf raises bare ValueErrors / struct errors on corrupt files
    size = pathlib.Path(path).stat().st_size
    raise ValueError(f"{path}: not a readable GGUF file ({type(e).__name__}: {e}; {size} bytes, "
                     "truncated or corrupt header?)") from e


def low_bit_layer_types(path: str | pathlib.Path) -> list[str]:
  """The `LOW_BIT_TYPES` among the quant types of the decoder-layer tensors (blk.*) of a GGUF file, sorted."""
  reader = open_gguf(pathlib.Path(path))
  return sorted({t.tensor_type.name for t in reader.tensors
                 if t.name.startswith("blk.") and t.tensor_type.name in LOW_BIT_TYPES})


def load_gguf(path: str | pathlib.Path, dtype=np.float32) -> tuple[dict, ModelConfig]:
  """(params as NumPy, config) from a GGUF file; every tensor dequantised to `dtype`."""
  import gguf  # deferred: only GGUF users need it
  path = pathlib.Path(path)
  if not path.exists():
    raise FileNotFoundError(f"{path}: GGUF file not found")
  reader = open_gguf(path)
  hf = hf_config_from_gguf(reader, str(path))
  config = ModelConfig.from_hf(hf, source=str(path))
  sd = {}
  for t in reader.tensors:
    qtype = t.tensor_type.name
    if qtype not in SUPPORTED_QUANT_TYPES:
      raise ValueError(f"{path}: tensor {t.name} has quant type {qtype}; supported: "
                       f"{', '.join(SUPPORTED_QUANT_TYPES)}")
    w = np.asarray(gguf.quants.dequantize(t.data, t.tensor_type), dtype=np.float32)
    parts = t.name.split(".")
    if parts[0] == "blk":
      i, kind, leaf = parts[1], parts[2], parts[3]
      if kind not in _TENSOR_NAMES:
        sd[t.name] = w  # not consumed: params_from_state_dict reports it
        continue
      if hf["model_type"] == "llama" and kind in ("attn_q", "attn_k"):
        w = _unpermute(w, config.num_heads if kind == "attn_q" else config.num_kv_heads)
      sd[f"layers.{i}.{_TENSOR_NAMES[kind]}.{leaf}"] = w
    elif t.name == "token_embd.weight":
      sd["embed_tokens.weight"] = w
    elif t.name == "output_norm.weight":
      sd["norm.weight"] = w
    elif t.name == "output.weight":
      sd["lm_head.weight"] = w
    else:
      sd[t.name] = w
  return params_from_state_dict(sd, config, dtype, source=str(path)), config
