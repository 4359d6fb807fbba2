"""The peer worker of benchmarks/sft.py: one case on transformers (`AutoModelForCausalLM.from_config`, sdpa, bf16)
with peft LoRA on q,k,v,o,gate,up,down (or, with params "full", every parameter trainable), the autocast step of
`gpu.time_torch_lora_steps`, timed; the recipe (LoRA r, alpha, learning rate) is fineflax's.
"""
from __future__ import annotations

from benchmarks import gpu
from benchmarks._sft_fineflax import LORA_ALPHA, LORA_R, LR

HF_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def torch_worker(spec: dict) -> dict:
  import peft
  import torch
  import transformers

  s, b, t = spec["shape"], spec["batch"], spec["seq"]
  cuda = torch.cuda.is_available()
  device = torch.device("cuda" if cuda else "cpu")
  torch.manual_seed(0)
  cfg = transformers.LlamaConfig(
      vocab_size=s["vocab"], hidden_size=s["hidden"], intermediate_size=s["inter"],
      num_hidden_layers=s["layers"], num_attention_heads=s["heads"], num_key_value_heads=s["kv_heads"],
      head_dim=s["head_dim"], rope_parameters={"rope_type": "default", "rope_theta": s["rope_theta"]},
      tie_word_embeddings=True, max_position_embeddings=max(t, 2048), rms_norm_eps=1e-5, use_cache=False)
  with device:
    model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16, attn_implementation="sdpa")
  if spec["ckpt"]:
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
  if spec.get("params", "lora") == "lora":
    model = peft.get_peft_model(model, peft.LoraConfig(r=LORA_R, lora_alpha=LORA_ALPHA, lora_dropout=0.0,
                                                       target_modules=list(HF_TARGETS), task_type="CAUSAL_LM"))
  model.train()
  forward = torch.compile(model) if spec["compile"] else model
  tokens = torch.randint(0, s["vocab"], (b, t), device=device)
  result = gpu.time_torch_lora_steps(model, forward, tokens, lr=LR, warmup=spec["warmup"],
                                      steps=spec["steps"], reset_peak_after_warmup=True)
  trainable = [p for p in model.parameters() if p.requires_grad]
  return dict(result, xla_bytes=None, trainable_params=sum(p.numel() for p in trainable),
              optimizer_state_dtype=str(trainable[0].dtype).replace("torch.", ""))
