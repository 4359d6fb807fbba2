"""Hugging Face `config.json` <-> ModelConfig, strictly: a field that changes the math is implemented or
refused at load time, with an error naming the file, the field and its value.

Rule for fields this module does not consume: keys in `HARMLESS` (bookkeeping, training-only dropout,
generation defaults) pass; any other key passes only when its value is None, False or empty, else the
load fails. So a checkpoint never silently computes something other than what transformers computes.
"""
from __future__ import annotations

from typing import Any, Mapping

# the Hugging Face vocabulary ModelConfig speaks: model types, activations, layer types
SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3", "gemma2", "gemma3_text", "phi3")
ACTIVATIONS = ("silu", "gelu", "gelu_pytorch_tanh", "relu")
SLIDING, FULL = "sliding_attention", "full_attention"

HARMLESS = frozenset("""
_name_or_path architectures attention_dropout auto_map bos_token_id chunk_size_feed_forward dtype torch_dtype
eos_token_id pad_token_id sep_token_id id2label label2id initializer_range is_encoder_decoder is_decoder
output_attentions output_hidden_states output_scores problem_type return_dict return_dict_in_generate
transformers_version use_cache model_type pretraining_tp embd_pdrop resid_pdrop cache_implementation
tokenizer_class task_specific_params prefix finetuning_task tf_legacy_loss use_bfloat16 torchscript
add_cross_attention bad_words_ids begin_suppress_tokens cross_attention_hidden_size decoder_start_token_id
diversity_penalty do_sample early_stopping encoder_no_repeat_ngram_size exponential_decay_length_penalty
forced_bos_token_id forced_eos_token_id length_penalty max_length min_length no_repeat_ngram_size
num_beam_groups num_beams num_return_sequences remove_invalid_values repetition_penalty suppress_tokens
temperature tie_encoder_decoder top_k top_p typical_p max_position_embeddings
is_llama_config transformers.js_config unsloth_version unsloth_fixed model_name _attn_implementation_autoset
attn_implementation _attn_implementation use_flash_attn use_flash_attention_2 keys_to_ignore_at_inference
gradient_checkpointing
""".split())
_COMMON = {"vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
           "num_key_value_heads", "head_dim", "rms_norm_eps", "rope_theta", "rope_scaling", "rope_parameters",
           "tie_word_embeddings"}
_FAMILY_KEYS = {  # keys each family reads (besides _COMMON)
    "llama": {"hidden_act", "attention_bias", "mlp_bias"},
    "mistral": {"hidden_act", "sliding_window", "layer_types"},
    "qwen2": {"hidden_act", "attention_bias", "use_sliding_window", "sliding_window", "max_window_layers",
              "layer_types"},
    "qwen3": {"hidden_act", "attention_bias", "use_sliding_window", "sliding_window", "max_window_layers",
              "layer_types"},
    "gemma2": {"hidden_act", "hidden_activation", "attention_bias", "query_pre_attn_scalar", "sliding_window",
               "layer_types", "final_logit_softcapping", "attn_logit_softcapping",
               "use_bidirectional_attention"},
    "gemma3_text": {"hidden_act", "hidden_activation", "attention_bias", "query_pre_attn_scalar",
                    "sliding_window", "layer_types", "final_logit_softcapping", "attn_logit_softcapping",
                    "use_bidirectional_attention", "rope_local_base_freq", "sliding_window_pattern",
                    "_sliding_window_pattern"},
    "phi3": {"hidden_act", "sliding_window", "original_max_position_embeddings", "partial_rotary_factor"},
}
_DEFAULTS = {  # transformers' config-class defaults for fields a config.json may omit
    "gemma2": {"final_logit_softcapping": 30.0, "attn_logit_softcapping": 50.0, "sliding_window": 4096,
               "query_pre_attn_scalar": 256, "tie_word_embeddings": True, "rope_theta": 10000.0},
    "gemma3_text": {"sliding_window": 4096, "query_pre_attn_scalar": 256, "tie_word_embeddings": True,
                    "rope_theta": 1_000_000.0},
    "qwen2": {"sliding_window": 4096, "max_window_layers": 28},
    "qwen3": {"sliding_window": 4096, "max_window_layers": 28},
    "mistral": {"sliding_window": 4096},
    "phi3": {"rms_norm_eps": 1e-5},
}
_NULL_MEANS_NONE = {"sliding_window", "final_logit_softcapping", "attn_logit_softcapping"}
ROPE_TYPES = ("default", "linear", "llama3", "yarn", "dynamic")
_ROPE_KEYS = {"rope_type", "type", "rope_theta", "factor", "low_freq_factor", "high_freq_factor",
              "original_max_position_embeddings", "attention_factor", "beta_fast", "beta_slow", "mscale",
              "mscale_all_dim", "truncate", "partial_rotary_factor"}
_ARCH = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM",
         "qwen3": "Qwen3ForCausalLM", "gemma2": "Gemma2ForCausalLM", "gemma3_text": "Gemma3ForCausalLM",
         "phi3": "Phi3ForCausalLM"}


def _empty(v) -> bool:
  return v is None or v is False or (isinstance(v, (list, dict, tuple, str)) and len(v) == 0)


def _freeze(v):
  return tuple(v) if isinstance(v, list) else v


def _rope(d: Mapping[str, Any] | None, theta_default: float, mpe: int, field: str, source: str):
  """(theta, frozen scaling items or None) of one rope dict; unsupported settings raise."""
  d = dict(d or {})
  for k, v in d.items():
    if k not in _ROPE_KEYS and not _empty(v):
      raise ValueError(f"{source}: {field}.{k}={v!r} is not understood by fineflax; refusing to load "
                       "rather than compute something else than transformers")
  theta = float(d.pop("rope_theta", None) or theta_default)
  prf = d.pop("partial_rotary_factor", 1.0)
  if prf is not None and float(prf) != 1.0:
    raise ValueError(f"{source}: {field}.partial_rotary_factor={prf!r}: partial rotary embeddings are "
                     "not supported")
  kind = d.get("rope_type", d.get("type")) or "default"
  if kind not in ROPE_TYPES:
    raise ValueError(f"{source}: {field}.rope_type={kind!r} is not supported (supported: "
                     f"{', '.join(ROPE_TYPES)})")
  if kind == "default":
    return theta, None
  d["rope_type"] = kind
  d.pop("type", None)
  need = {"linear": ["factor"], "llama3": ["factor", "low_freq_factor", "high_freq_factor",
                                          "original_max_position_embeddings"],
          "dynamic": ["factor"], "yarn": []}[kind]
  if kind == "yarn":
    d.setdefault("original_max_position_embeddings", mpe)
    if d.get("factor") is None:
      d["factor"] = mpe / d["original_max_position_embeddings"]
  for k in need:
    if d.get(k) is None:
      raise ValueError(f"{source}: {field} of type {kind!r} needs {k!r}")
  d = {k: v for k, v in d.items() if v is not None}
  return theta, tuple(sorted((k, _freeze(v)) for k, v in d.items()))


def config_kwargs_from_hf(hf: Mapping[str, Any], source: str) -> dict[str, Any]:
  """ModelConfig keyword arguments from a config.json dict (see the module docstring for the rules)."""
  mt = hf.get("model_type")
  if mt not in SUPPORTED_MODEL_TYPES:
    hint = " (only the text model 'gemma3_text' of Gemma 3 is supported)" if mt == "gemma3" else ""
    raise ValueError(f"{source}: unsupported architecture model_type={mt!r} "
                     f"(architectures={hf.get('architectures')}); fineflax supports "
                     f"{', '.join(SUPPORTED_MODEL_TYPES)}{hint}")
  known = HARMLESS | _COMMON | _FAMILY_KEYS[mt]
  for k, v in hf.items():
    if k not in known and not _empty(v):
      raise ValueError(f"{source}: field {k}={v!r} is not understood by fineflax for model_type {mt!r}; "
                       "refusing to load rather than compute something else than transformers")
  # an explicit null keeps its meaning (no window, no soft-cap) except where it stands for the default
  hf = {**_DEFAULTS.get(mt, {}), **{k: v for k, v in hf.items() if v is not None or k in _NULL_MEANS_NONE}}

  def need(key):
    if key not in hf:
      raise ValueError(f"{source}: missing field {key!r} for model_type {mt!r}")
    return hf[key]
  gemma = mt in ("gemma2", "gemma3_text")
  num_layers = int(need("num_hidden_layers"))
  num_heads = int(need("num_attention_heads"))
  hidden = int(need("hidden_size"))
  mpe = int(hf.get("max_position_embeddings", 4096))

  act_key = "hidden_activation" if gemma else "hidden_act"
  act = hf.get(act_key, "gelu_pytorch_tanh" if gemma else "silu")
  if act not in ACTIVATIONS:
    raise ValueError(f"{source}: {act_key}={act!r} is not supported (supported: {', '.join(ACTIVATIONS)})")
  if hf.get("use_bidirectional_attention"):
    raise ValueError(f"{source}: use_bidirectional_attention={hf['use_bidirectional_attention']!r} is not "
                     "supported (causal decoders only)")

  # rope: one dict (rope_parameters, or legacy rope_scaling + rope_theta), or one per layer type (Gemma 3)
  params = hf.get("rope_parameters") or {}
  theta0 = float(hf.get("rope_theta", 10000.0))
  local_theta = local_scaling = None
  if FULL in params or SLIDING in params:
    theta, scaling = _rope(params.get(FULL), theta0, mpe, f"rope_parameters.{FULL}", source)
    local_theta, local_scaling = _rope(params.get(SLIDING), float(hf.get("rope_local_base_freq", 10000.0)),
                                       mpe, f"rope_parameters.{SLIDING}", source)
  else:
    d = dict(params) if params else dict(hf.get("rope_scaling") or {})
    if "partial_rotary_factor" in hf:
      d.setdefault("partial_rotary_factor", hf["partial_rotary_factor"])
    theta, scaling = _rope(d, theta0, mpe, "rope_parameters" if params else "rope_scaling", source)
    if mt == "gemma3_text":
      local_theta = float(hf.get("rope_local_base_freq", 10000.0))

  # sliding windows
  window = hf.get("sliding_window")
  if mt in ("qwen2", "qwen3") and not hf.get("use_sliding_window", False):
    window = None
  if window is not None and (not isinstance(window, int) or window < 1):
    raise ValueError(f"{source}: sliding_window={window!r}: expected a positive integer or null")
  layer_types = hf.get("layer_types")
  if mt in ("mistral", "phi3"):  # their attention ignores layer_types: every layer slides when set
    layer_types = [SLIDING] * num_layers
  elif layer_types is None:
    if mt in ("qwen2", "qwen3"):
      mwl = int(hf.get("max_window_layers", 28))
      layer_types = [SLIDING if window is not None and i >= mwl else FULL for i in range(num_layers)]
    elif gemma:
      pattern = 2 if mt == "gemma2" else int(hf.get("sliding_window_pattern", hf.get("_sliding_window_pattern", 6)))
      layer_types = [SLIDING if (i + 1) % pattern else FULL for i in range(num_layers)]
    else:
      layer_types = [FULL] * num_layers
  layer_types = tuple(layer_types)
  if len(layer_types) != num_layers or not set(layer_types) <= {SLIDING, FULL}:
    raise ValueError(f"{source}: layer_types={list(layer_types)!r}: expected {num_layers} entries of "
                     f"{SLIDING!r} / {FULL!r}")
  if window is None or SLIDING not in layer_types:
    window, layer_types = None, ()

  attn_bias = bool(hf.get("attention_bias", False))
  eos = hf.get("eos_token_id")
  eos = tuple(eos) if isinstance(eos, (list, tuple)) else (() if eos is None else (int(eos),))
  qpas = hf.get("query_pre_attn_scalar") if gemma else None
  return dict(
      vocab_size=int(need("vocab_size")), hidden_size=hidden,
      intermediate_size=int(need("intermediate_size")), num_layers=num_layers, num_heads=num_heads,
      num_kv_heads=int(hf.get("num_key_value_heads") or num_heads),
      head_dim=int(hf.get("head_dim") or hidden // num_heads),
      rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)), rope_theta=theta, rope_scaling=scaling,
      tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
      attention_bias=attn_bias or mt == "qwen2",
      attention_out_bias=attn_bias and mt in ("llama", "qwen3", "gemma2", "gemma3_text"),
      mlp_bias=bool(hf.get("mlp_bias", False)) and mt == "llama",
      qk_norm=mt in ("qwen3", "gemma3_text"), max_position_embeddings=mpe, model_type=mt,
      bos_token_id=hf.get("bos_token_id"), eos_token_ids=eos, pad_token_id=hf.get("pad_token_id"),
      hidden_act=act, sliding_window=window, layer_types=layer_types,
      local_rope_theta=local_theta if local_theta != theta or local_scaling != scaling else None,
      local_rope_scaling=local_scaling if local_theta is not None else None,
      norm_offset=1.0 if gemma else 0.0, embed_scale=gemma, sandwich_norms=gemma,
      query_pre_attn_scalar=None if qpas is None else float(qpas),
      attn_logit_softcapping=_float_or_none(hf.get("attn_logit_softcapping")) if gemma else None,
      final_logit_softcapping=_float_or_none(hf.get("final_logit_softcapping")) if gemma else None,
  )


def _float_or_none(v):
  return None if v is None else float(v)


def _rope_dict(theta: float, scaling) -> dict[str, Any]:
  d = {"rope_type": "default", "rope_theta": theta}
  if scaling:
    d.update({k: list(v) if isinstance(v, tuple) else v for k, v in scaling})
  return d


def hf_from_config(c) -> dict[str, Any]:
  """The Hugging Face `config.json` dict transformers needs to rebuild `c` (a `ModelConfig`)."""
  mt = c.model_type
  gemma = mt in ("gemma2", "gemma3_text")
  d = {
      "architectures": [_ARCH[mt]], "model_type": mt, "vocab_size": c.vocab_size,
      "hidden_size": c.hidden_size, "intermediate_size": c.intermediate_size,
      "num_hidden_layers": c.num_layers, "num_attention_heads": c.num_heads,
      "num_key_value_heads": c.num_kv_heads, "head_dim": c.head_dim, "rms_norm_eps": c.rms_norm_eps,
      "tie_word_embeddings": c.tie_word_embeddings, "max_position_embeddings": c.max_position_embeddings,
      "hidden_activation" if gemma else "hidden_act": c.hidden_act, "bos_token_id": c.bos_token_id,
      "eos_token_id": list(c.eos_token_ids) if len(c.eos_token_ids) != 1 else c.eos_token_ids[0],
      "pad_token_id": c.pad_token_id,
  }
  if mt == "gemma3_text":
    local = (c.local_rope_theta, c.local_rope_scaling) if c.local_rope_theta else (c.rope_theta, c.rope_scaling)
    d["rope_parameters"] = {FULL: _rope_dict(c.rope_theta, c.rope_scaling), SLIDING: _rope_dict(*local)}
  else:
    d["rope_parameters"] = _rope_dict(c.rope_theta, c.rope_scaling)
  if mt in ("llama", "qwen3") or gemma:
    d["attention_bias"] = c.attention_out_bias
  if mt == "llama":
    d["mlp_bias"] = c.mlp_bias
  if gemma:
    q = c.query_pre_attn_scalar
    d.update(query_pre_attn_scalar=int(q) if q is not None and float(q).is_integer() else q,
             attn_logit_softcapping=c.attn_logit_softcapping,
             final_logit_softcapping=c.final_logit_softcapping)
  if mt in ("qwen2", "qwen3"):
    d.update(use_sliding_window=c.has_sliding, sliding_window=c.sliding_window, max_window_layers=0)
  elif mt in ("mistral", "phi3") or gemma:
    d["sliding_window"] = c.sliding_window
  if c.has_sliding and mt not in ("mistral", "phi3"):
    d["layer_types"] = list(c.layer_types)
  elif gemma or mt in ("qwen2", "qwen3"):
    d["layer_types"] = [FULL] * c.num_layers
  return d
