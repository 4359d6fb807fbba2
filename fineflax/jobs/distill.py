"""Distillation job: the student's fresh LoRA (on its quantised base) learns a teacher's token distributions.

Each step: the teacher samples completions to `prompts_per_step` training questions from its own prompt
(with `distill.only_correct`, completions with a wrong answer get a zero mask: rejection-sampled KD);
the student reads the same completions after its own prompt; one `distill_step` (forward KL, see
fineflax/train/distill_step.py). Held-out greedy accuracy of the teacher and of the student before and after
goes to summary.json; the adapter is exported in PEFT format. No checkpoints or resume (short runs).
"""
from __future__ import annotations

import json
import os
import time

import jax
import numpy as np

from fineflax import lora as lora_lib
from fineflax import quant
from fineflax.data.iterator import pad_id_of
from fineflax.io import atomic_write_text
from fineflax.jobs.common import compute_dtype, make_workdir, setup_model
from fineflax.jobs.grpo import prompt_ids
from fineflax.models import load
from fineflax.rewards.registry import score_completions
from fineflax.rl.rollout import build_rl_batch, round_up, sample_rows
from fineflax.rl.tasks import generate_problems
from fineflax.sampling import generate
from fineflax.train.distill_step import make_distill_fn
from fineflax.train.metric_writer import MetricWriter
from fineflax.train.optim import make_optimizer
from fineflax.train.sft_step import init_state


def setup_teacher(config, student_base, model_config, dtype):
  """(params, model config, lora, lora scale) of the teacher (see configs/distill.py)."""
  t = config.teacher
  if t.source:
    params, t_config, _ = load(t.source, dtype=dtype, with_tokenizer=False)
    if t_config.vocab_size != model_config.vocab_size:
      raise ValueError(f"config.teacher.source={t.source!r}: vocabulary {t_config.vocab_size} != the student's "
                       f"{model_config.vocab_size}")
    if t.quant != "none":
      params = quant.quantize_params(params, kind=t.quant)
  else:
    params, t_config = student_base, model_config
  if not t.adapter:
    return params, t_config, None, 1.0
  lora, cfg = lora_lib.import_peft(t.adapter, t_config)
  return params, t_config, lora, lora_lib.lora_scale(cfg)


def accuracy(params, model_config, tokenizer, problems, system_prompt, task, dtype, lora=None, scale=1.0):
  """Greedy held-out accuracy under `task.accuracy_reward`, and the mean completion length."""
  correct, lengths = [], []
  for i in range(0, len(problems), task.eval_batch_size):
    chunk = problems[i:i + task.eval_batch_size]
    out = generate(params, model_config, [prompt_ids(tokenizer, system_prompt, p.question) for p in chunk],
                   max_new_tokens=task.eval_max_new_tokens, temperature=0.0, tokenizer=tokenizer, lora=lora,
                   lora_scale=scale, dtype=dtype)
    total, _, _ = score_completions({task.accuracy_reward: 1.0}, [p.question for p in chunk], out.texts,
                                    [{"answer": str(p.answer)} for p in chunk])
    correct += list(total)
    lengths += list(out.lengths)
  return {"accuracy": float(np.mean(correct)), "completion_length": float(np.mean(lengths))}


def run(config, workdir: str | None) -> dict:
  workdir = make_workdir(config, workdir)
  dtype = compute_dtype(config)
  task, dc = config.task, config.distill
  base, model_config, tok, lora_cfg, lora = setup_model(config)
  scale = lora_lib.lora_scale(lora_cfg)
  t_params, t_config, t_lora, t_scale = setup_teacher(config, base, model_config, dtype)
  t_system = config.teacher.system_prompt or task.system_prompt
  optimizer = make_optimizer(config.optimizer)
  step_fn = make_distill_fn(optimizer, model_config=model_config, teacher_config=t_config,
                            teacher_lora_scale=t_scale, lora_scale=scale, tau=dc.tau, top_k=dc.top_k,
                            remat=config.model.remat, dtype=dtype, logits_chunk=config.model.logits_chunk)
  sizes = dict(max_start=task.max_start, max_addend=task.max_addend)
  train = generate_problems(task.num_train, "train", tuple(task.num_steps), config.seed, **sizes)
  held_out = generate_problems(task.num_eval, "test", tuple(task.num_steps), task.eval_seed, **sizes)
  order = np.random.default_rng(config.seed).permutation(len(train))
  rng = jax.random.PRNGKey(config.seed + 7)
  pad_id, width = pad_id_of(tok), round_up(config.teacher.max_new_tokens, 16)
  evals = {"teacher": accuracy(t_params, t_config, tok, held_out, t_system, task, dtype, t_lora, t_scale),
           "student_before": accuracy(base, model_config, tok, held_out, task.system_prompt, task, dtype)}
  print(f"teacher {evals['teacher']}, student before {evals['student_before']}", flush=True)
  state = init_state(lora, optimizer, config.seed)
  writer = MetricWriter(os.path.join(workdir, "logs"))
  history = []
  for step in range(1, config.num_steps + 1):
    t0 = time.time()
    idx = [order[((step - 1) * dc.prompts_per_step + j) % len(train)] for j in range(dc.prompts_per_step)]
    problems = [train[i] for i in idx]
    rng, key = jax.random.split(rng)
    t_prompts = [prompt_ids(tok, t_system, p.question) for p in problems]
    out = generate(t_params, t_config, t_prompts, max_new_tokens=config.teacher.max_new_tokens,
                   temperature=config.teacher.temperature, tokenizer=tok, rng=key, lora=t_lora,
                   lora_scale=t_scale, dtype=dtype)
    comps, masks = sample_rows(out)
    correct, _, _ = score_completions({task.accuracy_reward: 1.0}, [p.question for p in problems], out.texts,
                                      [{"answer": str(p.answer)} for p in problems])
    if dc.only_correct:  # rejection-sampled distillation: the KL only on completions with the right answer
      masks = [m if c > 0 else [0.0] * len(m) for m, c in zip(masks, correct)]
    student = build_rl_batch([prompt_ids(tok, task.system_prompt, p.question) for p in problems], comps, masks,
                             pad_id=pad_id, completion_width=width, width_multiple=16)
    teacher = build_rl_batch(t_prompts, comps, masks, pad_id=pad_id, completion_width=width, width_multiple=16)
    batch = dict(student, teacher_tokens=teacher["tokens"], teacher_attention_mask=teacher["attention_mask"],
                 teacher_positions=teacher["positions"])
    state, metrics = step_fn(state, base, t_params, t_lora, batch)
    scalars = {k: float(v) for k, v in jax.device_get(metrics).items()}
    scalars["teacher_sample_accuracy"] = float(np.mean(correct))
    scalars["step_time_s"] = time.time() - t0
    history.append({"step": step, **scalars})
    writer.write_scalars(step, scalars)
    if step % config.log_every == 0 or step == config.num_steps:
      print(f"step {step}: kl {scalars['kl']:.4f} grad_norm {scalars['grad_norm']:.3f} "
            f"({scalars['step_time_s']:.1f}s)", flush=True)
  writer.close()
  evals["student_after"] = accuracy(base, model_config, tok, held_out, task.system_prompt, task, dtype,
                                    state["lora"], scale)
  print(f"student after {evals['student_after']}", flush=True)
  adapter_dir = os.path.join(workdir, "adapter")
  lora_lib.export_peft(state["lora"], lora_cfg, model_config, adapter_dir,
                       base_model_name_or_path=str(config.model.source))
  summary = {"eval": evals, "num_eval": len(held_out), "history": history, "adapter": adapter_dir,
             "config": config.to_dict()}
  atomic_write_text(os.path.join(workdir, "summary.json"), json.dumps(summary, indent=2, default=str))
  return summary
