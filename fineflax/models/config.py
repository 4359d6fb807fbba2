"""ModelConfig: the static description of one decoder (hashable, so it can be a jit static argument)."""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """Shape and numerics of a Llama-family decoder.

  Covers Llama 2/3 (rope scaling "llama3"), Mistral, Qwen2/2.5 (`attention_bias`: q/k/v bias),
  Qwen3 (`qk_norm`: RMSNorm on q and k per head) and SmolLM2 (Llama with `tie_word_embeddings`).
  """
  vocab_size: int
  hidden_size: int
  intermediate_size: int
  num_layers: int
  num_heads: int
  num_kv_heads: int
  head_dim: int
  rms_norm_eps: float = 1e-5
  rope_theta: float = 10000.0
  rope_scaling: tuple[tuple[str, Any], ...] | None = None  # sorted items of the HF rope_scaling dict
  tie_word_embeddings: bool = False
  attention_bias: bool = False
  qk_norm: bool = False
  max_position_embeddings: int = 4096
  model_type: str = "llama"
  bos_token_id: int | None = None
  eos_token_ids: tuple[int, ...] = ()
  pad_token_id: int | None = None
  attention: str = "auto"  # attention kernel: auto (cuDNN for bf16/f16 on GPU, else XLA), cudnn or xla

  @property
  def rope_scaling_dict(self) -> dict[str, Any] | None:
    return dict(self.rope_scaling) if self.rope_scaling else None

  def linear_shapes(self) -> dict[str, tuple[int, int]]:
    """(in, out) of each linear projection of one layer, in y = x @ kernel layout."""
    h, i = self.hidden_size, self.intermediate_size
    q, kv = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
    return {"q": (h, q), "k": (h, kv), "v": (h, kv), "o": (q, h), "gate": (h, i), "up": (h, i),
            "down": (i, h)}

  def num_params(self) -> int:
    """Parameter count (embedding counted once when tied)."""
    h, i, hd = self.hidden_size, self.intermediate_size, self.head_dim
    attn = h * hd * (2 * self.num_heads + 2 * self.num_kv_heads)
    if self.attention_bias:
      attn += hd * (self.num_heads + 2 * self.num_kv_heads)
    layer = attn + 3 * h * i + 2 * h + (2 * hd if self.qk_norm else 0)
    emb = self.vocab_size * h * (1 if self.tie_word_embeddings else 2)
    return self.num_layers * layer + emb + h

  @classmethod
  def from_hf(cls, hf: Mapping[str, Any], source: str = "config.json") -> "ModelConfig":
    """Builds the config from a Hugging Face `config.json` dict; errors name `source` and the field."""
    model_type = hf.get("model_type")
    if model_type not in SUPPORTED_MODEL_TYPES:
      archs = hf.get("architectures")
      raise ValueError(
          f"{source}: unsupported architecture model_type={model_type!r} (architectures={archs}); "
          f"fineflax supports {', '.join(SUPPORTED_MODEL_TYPES)}")
    def need(key):
      if key not in hf:
        raise ValueError(f"{source}: missing field {key!r} for model_type {model_type!r}")
      return hf[key]
    num_heads = int(need("num_attention_heads"))
    hidden = int(need("hidden_size"))
    head_dim = hf.get("head_dim") or hidden // num_heads
    rope_params = hf.get("rope_parameters") or {}
    rope_scaling = hf.get("rope_scaling") or None
    if rope_scaling is None and rope_params.get("rope_type", "default") not in ("default", None):
      rope_scaling = rope_params
    theta = hf.get("rope_theta", rope_params.get("rope_theta", 10000.0))
    if rope_scaling:
      rope_scaling = dict(rope_scaling)
      rope_scaling.pop("rope_theta", None)
      kind = rope_scaling.get("rope_type", rope_scaling.get("type"))
      if kind in (None, "default"):
        rope_scaling = None
      else:
        rope_scaling = tuple(sorted((k, _freeze(v)) for k, v in rope_scaling.items()))
    eos = hf.get("eos_token_id")
    eos = tuple(eos) if isinstance(eos, (list, tuple)) else (() if eos is None else (int(eos),))
    return cls(
        vocab_size=int(need("vocab_size")),
        hidden_size=hidden,
        intermediate_size=int(need("intermediate_size")),
        num_layers=int(need("num_hidden_layers")),
        num_heads=num_heads,
        num_kv_heads=int(hf.get("num_key_value_heads") or num_heads),
        head_dim=int(head_dim),
        rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
        rope_theta=float(theta),
        rope_scaling=rope_scaling,
        tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
        attention_bias=bool(hf.get("attention_bias", model_type == "qwen2")),
        qk_norm=model_type == "qwen3",
        max_position_embeddings=int(hf.get("max_position_embeddings", 4096)),
        model_type=model_type,
        bos_token_id=hf.get("bos_token_id"),
        eos_token_ids=eos,
        pad_token_id=hf.get("pad_token_id"),
    )

  def to_hf(self) -> dict[str, Any]:
    """The Hugging Face `config.json` dict transformers needs to rebuild this model."""
    arch = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM",
            "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}[self.model_type]
    d = {
        "architectures": [arch], "model_type": self.model_type, "vocab_size": self.vocab_size,
        "hidden_size": self.hidden_size, "intermediate_size": self.intermediate_size,
        "num_hidden_layers": self.num_layers, "num_attention_heads": self.num_heads,
        "num_key_value_heads": self.num_kv_heads, "head_dim": self.head_dim,
        "rms_norm_eps": self.rms_norm_eps, "rope_theta": self.rope_theta,
        "tie_word_embeddings": self.tie_word_embeddings,
        "max_position_embeddings": self.max_position_embeddings, "hidden_act": "silu",
        "bos_token_id": self.bos_token_id,
        "eos_token_id": list(self.eos_token_ids) if len(self.eos_token_ids) != 1 else self.eos_token_ids[0],
        "pad_token_id": self.pad_token_id,
    }
    if self.model_type == "llama":
      d["attention_bias"] = self.attention_bias
    if self.rope_scaling:
      d["rope_scaling"] = {k: list(v) if isinstance(v, tuple) else v for k, v in self.rope_scaling}
    return d


def _freeze(v):
  return tuple(v) if isinstance(v, list) else v
