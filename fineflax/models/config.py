"""ModelConfig: the static description of one decoder (hashable, so it can be a jit static argument)."""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from fineflax.models.hf_config import SLIDING, config_kwargs_from_hf, hf_from_config


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """Shape and numerics of a decoder of the Llama / Gemma / Phi-3 families.

  Covers Llama 2/3 (rope scaling "llama3"), Mistral (`sliding_window`), Qwen2/2.5 (`attention_bias`:
  q/k/v bias; `use_sliding_window`), Qwen3 (`qk_norm`: RMSNorm on q and k per head), SmolLM2 (Llama with
  `tie_word_embeddings`), Gemma 2 / Gemma 3 text ((1 + w) RMSNorms, sandwich norms around attention and
  MLP, sqrt(hidden) embedding scale, soft-capping, sliding/global layer alternation, per-layer-type rope)
  and Phi-3 (fused qkv / gate_up weights, split at import).

  `layer_types[i]` is "sliding_attention" (a query at position p sees keys at positions in
  (p - sliding_window, p]) or "full_attention"; empty = every layer full.
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
  rope_scaling: tuple[tuple[str, Any], ...] | None = None  # sorted items of the HF rope dict
  tie_word_embeddings: bool = False
  attention_bias: bool = False  # q/k/v biases
  qk_norm: bool = False
  max_position_embeddings: int = 4096
  model_type: str = "llama"
  bos_token_id: int | None = None
  eos_token_ids: tuple[int, ...] = ()
  pad_token_id: int | None = None
  hidden_act: str = "silu"
  attention_out_bias: bool = False  # o_proj bias (Llama / Qwen3 / Gemma attention_bias=True)
  mlp_bias: bool = False  # gate / up / down biases (Llama mlp_bias=True)
  sliding_window: int | None = None
  layer_types: tuple[str, ...] = ()
  local_rope_theta: float | None = None  # rope of sliding layers when it differs (Gemma 3)
  local_rope_scaling: tuple[tuple[str, Any], ...] | None = None
  norm_offset: float = 0.0  # RMSNorm scale is (norm_offset + w): 1 for Gemma
  embed_scale: bool = False  # embeddings multiplied by sqrt(hidden_size) (Gemma)
  sandwich_norms: bool = False  # Gemma: post-attention, pre- and post-feed-forward norms
  query_pre_attn_scalar: float | None = None  # attention scale query_pre_attn_scalar^-0.5 (Gemma)
  attn_logit_softcapping: float | None = None  # scores <- cap * tanh(scores / cap)
  final_logit_softcapping: float | None = None  # logits <- cap * tanh(logits / cap)
  attention: str = "auto"  # attention kernel: auto (cuDNN for bf16/f16 on GPU, else XLA), cudnn or xla
  layer_loop: str = "scan"  # layers run as: scan (lax.scan over the stacked params) or unrolled (a Python loop)

  @property
  def rope_scaling_dict(self) -> dict[str, Any] | None:
    return dict(self.rope_scaling) if self.rope_scaling else None

  @property
  def has_sliding(self) -> bool:
    return self.sliding_window is not None and SLIDING in self.layer_types

  def layer_windows(self) -> list[int]:
    """Per layer: the sliding window, or 0 for full attention."""
    if not self.has_sliding:
      return [0] * self.num_layers
    return [self.sliding_window if t == SLIDING else 0 for t in self.layer_types]

  def linear_shapes(self) -> dict[str, tuple[int, int]]:
    """(in, out) of each linear projection of one layer, in y = x @ kernel layout."""
    h, i = self.hidden_size, self.intermediate_size
    q, kv = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
    return {"q": (h, q), "k": (h, kv), "v": (h, kv), "o": (q, h), "gate": (h, i), "up": (h, i),
            "down": (i, h)}

  def bias_names(self) -> list[str]:
    """The linears that carry a bias."""
    return ((["q", "k", "v"] if self.attention_bias else []) + (["o"] if self.attention_out_bias else [])
            + (["gate", "up", "down"] if self.mlp_bias else []))

  def vector_names(self) -> list[str]:
    """The per-layer norm weights."""
    return (["attn_norm", "mlp_norm"] + (["q_norm", "k_norm"] if self.qk_norm else [])
            + (["post_attn_norm", "post_mlp_norm"] if self.sandwich_norms else []))

  def num_params(self) -> int:
    """Parameter count (embedding counted once when tied)."""
    shapes = self.linear_shapes()
    layer = sum(i * o for i, o in shapes.values()) + sum(shapes[n][1] for n in self.bias_names())
    layer += sum(self.head_dim if n in ("q_norm", "k_norm") else self.hidden_size
                 for n in self.vector_names())
    emb = self.vocab_size * self.hidden_size * (1 if self.tie_word_embeddings else 2)
    return self.num_layers * layer + emb + self.hidden_size

  @classmethod
  def from_hf(cls, hf: Mapping[str, Any], source: str = "config.json") -> "ModelConfig":
    """Builds the config from a Hugging Face `config.json` dict (see `fineflax.models.hf_config`): every
    field that changes the math is implemented or refused here, with an error naming `source`, the field
    and its value."""
    return cls(**config_kwargs_from_hf(hf, source))

  def to_hf(self) -> dict[str, Any]:
    """The Hugging Face `config.json` dict transformers needs to rebuild this model."""
    return hf_from_config(self)
