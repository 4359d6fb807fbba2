"""TRL worker of benchmarks/rl.py: `trl.GRPOTrainer` with transformers `generate` on random weights.

Same step as the fineflax worker: the model shape (LlamaForCausalLM from config, bf16, sdpa, tied
embeddings), prompts x group completions of exactly `new_tokens` tokens (`min_new_tokens`, temperature 1,
no top-k/top-p), the same rewards, peft LoRA r=16 alpha=32 on q,k,v,o,gate,up,down, loss_type "dapo"
(token-mean over the step's tokens, clip 0.2 / 0.28), beta 0, AdamW + clip 1.0, gradient checkpointing
on (TRL's default). One optimizer step per generation: per_device_train_batch_size = `micro`,
gradient_accumulation_steps = prompts * group / micro (= steps_per_generation).
Phases: step = time between consecutive `on_step_end` callbacks (after a CUDA sync); rollout = TRL's
`_generate_and_score_completions` (generate, decode, rewards, advantages); generate = its
`_generate_single_turn`; update = step - rollout (the micro-batches' forward/backward + optimizer).
"""
from __future__ import annotations

import os
import tempfile
import time

from benchmarks import _rl_common as C


def run(spec: dict) -> dict:
  import datasets
  import peft
  import torch
  import transformers
  import trl

  t_setup = time.perf_counter()
  s, n_new = spec["shape"], spec["new_tokens"]
  cuda = torch.cuda.is_available()
  sync = torch.cuda.synchronize if cuda else (lambda: None)
  torch.manual_seed(0)
  cfg = transformers.LlamaConfig(
      vocab_size=s["vocab"], hidden_size=s["hidden"], intermediate_size=s["inter"],
      num_hidden_layers=s["layers"], num_attention_heads=s["heads"], num_key_value_heads=s["kv_heads"],
      head_dim=s["head_dim"], rope_parameters={"rope_type": "default", "rope_theta": s["rope_theta"]},
      tie_word_embeddings=True, max_position_embeddings=max(2048, spec["prompt_len"] + n_new),
      rms_norm_eps=1e-5, bos_token_id=None, eos_token_id=C.EOS_ID, pad_token_id=C.PAD_ID)
  with torch.device("cuda" if cuda else "cpu"):
    model = transformers.AutoModelForCausalLM.from_config(
        cfg, dtype=torch.bfloat16 if cuda else torch.float32, attn_implementation="sdpa")
  model.generation_config.eos_token_id = C.EOS_ID
  model.generation_config.pad_token_id = C.PAD_ID
  tok = C.word_tokenizer(s["vocab"])
  rows = spec["prompts"] * spec["group"]
  micro = min(spec["trl_micro"], rows)
  if rows % micro:
    raise ValueError(f"prompts x group = {rows} is not a multiple of trl_micro={micro}")
  data = datasets.Dataset.from_dict({"prompt": [C.text_of(p) for p in C.prompts(spec)]})

  def reward(prompts, completions, **_):
    return [C.reward_of_text(c) for c in completions]

  split, marks = C.Split(), {}

  class Timed(trl.GRPOTrainer):
    def _generate_and_score_completions(self, inputs):
      sync()
      t = time.perf_counter()
      out = super()._generate_and_score_completions(inputs)
      sync()
      marks.setdefault("rollout", []).append(time.perf_counter() - t)
      return out

    def _generate_single_turn(self, *a, **k):
      sync()
      t = time.perf_counter()
      out = super()._generate_single_turn(*a, **k)
      sync()
      marks.setdefault("generate", []).append(time.perf_counter() - t)
      return out

  class StepTimes(transformers.TrainerCallback):
    def on_train_begin(self, *a, **k):
      sync()
      marks["last"] = time.perf_counter()

    def on_step_end(self, *a, **k):
      sync()
      t = time.perf_counter()
      split.new_step()
      split.add("step", t - marks["last"])
      for name in ("rollout", "generate"):
        split.add(name, sum(marks.pop(name, [])))
      split.steps[-1]["update"] = split.steps[-1]["step"] - split.steps[-1]["rollout"]
      marks["last"] = t

  out_dir = tempfile.mkdtemp(prefix="trl_grpo_")
  args = trl.GRPOConfig(
      output_dir=out_dir, per_device_train_batch_size=micro, gradient_accumulation_steps=rows // micro,
      num_generations=spec["group"], max_completion_length=n_new, temperature=1.0, top_p=1.0, top_k=0,
      generation_kwargs={"min_new_tokens": n_new}, beta=0.0, loss_type=spec["trl_loss"],
      epsilon=C.EPS_LOW, epsilon_high=C.EPS_HIGH, scale_rewards="group", mask_truncated_completions=False,
      learning_rate=C.LR, lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0, adam_beta2=0.999,
      max_grad_norm=1.0, max_steps=spec["warmup"] + spec["steps"], logging_steps=1, save_strategy="no",
      report_to=[], bf16=cuda, use_cpu=not cuda, gradient_checkpointing=True, shuffle_dataset=False,
      seed=0, disable_tqdm=True, dataloader_num_workers=0)
  peft_cfg = peft.LoraConfig(r=C.LORA_R, lora_alpha=C.LORA_ALPHA, lora_dropout=0.0,
                             target_modules=list(C.HF_TARGETS), task_type="CAUSAL_LM")
  trainer = Timed(model=model, reward_funcs=reward, args=args, train_dataset=data, processing_class=tok,
                  peft_config=peft_cfg, callbacks=[StepTimes()])
  sync()
  setup_s = time.perf_counter() - t_setup
  if cuda:
    torch.cuda.reset_peak_memory_stats()
  trainer.train()
  logs = [h for h in trainer.state.log_history if "loss" in h]
  last = logs[-1] if logs else {}
  res = C.summarize(split, spec["warmup"])
  return {**res, "setup_s": setup_s, "loss": last.get("loss"),
          "completion_len": last.get("completions/mean_length"),
          "peak_bytes": int(torch.cuda.max_memory_allocated()) if cuda else None,
          "settings": f"HF generate (dynamic cache); loss_type={spec['trl_loss']}, micro-batch {micro} x "
                      f"{rows // micro} accumulation, grad ckpt on",
          "versions": {"trl": trl.__version__, "torch": torch.__version__,
                       "transformers": transformers.__version__, "peft": peft.__version__}}
