"""GRPO-family RL job (GRPO, DAPO, Dr. GRPO; LUFFY with off-policy traces) on generated arithmetic tasks.

Each step: sample `prompts_per_step` questions, roll out `group_size` completions each from base+LoRA
(LUFFY: `n_off` of them replaced by solver traces), score them, form group advantages, optionally drop
zero-variance groups and refill (DAPO), recompute old/ref log-probs, then `num_iterations` updates.
"""
from __future__ import annotations

import json
import logging
import os
import time

import jax
import numpy as np
from tqdm import tqdm

from fineflax import lora as lora_lib
from fineflax.jobs.common import compute_dtype, make_workdir, setup_model
from fineflax.rewards import score_completions
from fineflax.rl.advantages import group_advantages, zero_variance_groups
from fineflax.rl.rollout import build_rl_batch, round_up, sample_rows
from fineflax.rl.step import make_rl_fns
from fineflax.rl.tasks import generate_problems
from fineflax.sampling import format_chat, generate
from fineflax.train.checkpoint import Checkpointer
from fineflax.train.metric_writer import MetricWriter
from fineflax.train.optim import make_optimizer
from fineflax.train.sft_step import init_state
from fineflax.train.signals import StopRequested


def prompt_ids(tokenizer, system_prompt: str, question: str) -> list[int]:
  messages = [{"role": "system", "content": system_prompt}, {"role": "user", "content": question}]
  return tokenizer(format_chat(tokenizer, messages), add_special_tokens=False)["input_ids"]


def trace_ids(tokenizer, solution: str, eos_id: int) -> list[int]:
  """An off-policy trace as completion tokens: the solver's worked solution, then end of turn."""
  return tokenizer(solution, add_special_tokens=False)["input_ids"] + [eos_id]


def evaluate_accuracy(base, model_config, tokenizer, problems, lora, scale, config, dtype) -> dict:
  """Greedy accuracy (math reward = 1) on `problems`, in batches of config.eval_batch_size."""
  correct, lengths = [], []
  for i in range(0, len(problems), config.eval_batch_size):
    chunk = problems[i:i + config.eval_batch_size]
    prompts = [prompt_ids(tokenizer, config.task.system_prompt, p.question) for p in chunk]
    out = generate(base, model_config, prompts, max_new_tokens=config.rl.max_new_tokens, temperature=0.0,
                   tokenizer=tokenizer, lora=lora, lora_scale=scale, dtype=dtype)
    total, _, _ = score_completions({"math": 1.0}, [p.question for p in chunk], out.texts,
                                    [{"answer": str(p.answer)} for p in chunk])
    correct += list(total)
    lengths += list(out.lengths)
  return {"eval_accuracy": float(np.mean(correct)), "eval_completion_length": float(np.mean(lengths))}


def rollout(base, model_config, tokenizer, problems, lora, scale, config, dtype, rng):
  """(prompts, completions, loss masks, is_off_policy, texts) for len(problems) groups of group_size."""
  rl = config.rl
  n_on = rl.group_size - rl.n_off
  prompts1 = [prompt_ids(tokenizer, config.task.system_prompt, p.question) for p in problems]
  prompts = [p for p in prompts1 for _ in range(n_on)]
  out = generate(base, model_config, prompts, max_new_tokens=rl.max_new_tokens,
                 temperature=rl.temperature, top_p=rl.top_p, tokenizer=tokenizer, rng=rng, lora=lora,
                 lora_scale=scale, dtype=dtype)
  comps, masks = sample_rows(out, mask_truncated=rl.mask_truncated)
  texts = list(out.texts)
  all_prompts, all_comps, all_masks, off, all_texts = [], [], [], [], []
  eos = model_config.eos_token_ids[0]
  for g, p in enumerate(problems):
    rows = range(g * n_on, (g + 1) * n_on)
    all_prompts += [prompts1[g]] * rl.group_size
    all_comps += [comps[r] for r in rows]
    all_masks += [masks[r] for r in rows]
    all_texts += [texts[r] for r in rows]
    off += [False] * n_on
    for _ in range(rl.n_off):
      ids = trace_ids(tokenizer, p.solution, eos)[:rl.max_new_tokens]
      all_comps.append(ids)
      all_masks.append([1.0] * len(ids))
      all_texts.append(p.solution)
      off.append(True)
  return all_prompts, all_comps, all_masks, np.array(off), all_texts


def run(config, workdir: str | None) -> dict:
  workdir = make_workdir(config, workdir)
  dtype = compute_dtype(config)
  rl = config.rl
  if not 0 <= rl.n_off < rl.group_size:
    raise ValueError(f"config.rl.n_off={rl.n_off} must be in [0, group_size={rl.group_size})")
  objective = "luffy" if rl.n_off > 0 else "grpo"
  base, model_config, tokenizer, lora_cfg, lora = setup_model(config)
  scale = lora_lib.lora_scale(lora_cfg)
  optimizer = make_optimizer(config.optimizer)
  loss_kwargs = dict(epsilon_low=rl.epsilon_low, epsilon_high=rl.epsilon_high,
                     dual_clip=rl.dual_clip or None, beta=rl.beta, entropy_coef=rl.entropy_coef,
                     agg_mode=rl.agg_mode, max_len=rl.max_new_tokens if rl.agg_mode == "sum" else None)
  if objective == "luffy":
    loss_kwargs.update(gamma=rl.luffy_gamma, on_policy_clip=rl.clip)
  else:
    loss_kwargs.update(clip=rl.clip)
  fwd_kwargs = dict(model_config=model_config, lora_scale=scale, remat=config.model.remat, dtype=dtype,
                    logits_chunk=config.model.logits_chunk)
  step_fn, logp_fn = make_rl_fns(optimizer, objective=objective, loss_kwargs=loss_kwargs,
                                 fwd_kwargs=fwd_kwargs)
  state = init_state(lora, optimizer, config.seed)
  train = generate_problems(config.task.num_train, "train", tuple(config.task.num_steps), config.seed)
  held_out = generate_problems(config.task.num_eval, "test", tuple(config.task.num_steps), 10_000)
  ckpt = Checkpointer(os.path.join(workdir, "checkpoints"), keep_last=2, keep_best=1,
                      best_metric="eval_accuracy", best_mode="max")
  restored = ckpt.restore(state)
  if restored is not None:
    state = restored[0]
  writer = MetricWriter(os.path.join(workdir, "logs"))
  order = np.random.default_rng(config.seed).permutation(len(train))
  pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else model_config.eos_token_ids[0]
  start, history, t_start = int(state["step"]) // rl.num_iterations, [], time.time()
  rng = jax.random.PRNGKey(config.seed + 7)
  if start == 0:
    m = evaluate_accuracy(base, model_config, tokenizer, held_out, None, scale, config, dtype)
    writer.write_scalars(0, m)
    history.append({"step": 0, "time_s": 0.0, **m})
    print(f"[step 0] held-out accuracy {m['eval_accuracy']:.3f}", flush=True)
  bar = tqdm(total=config.num_steps, initial=start, desc=objective, dynamic_ncols=True)
  with StopRequested() as stop:
    for step in range(start + 1, config.num_steps + 1):
      t0 = time.time()
      groups, rows, cursor, rounds = [], None, (step - 1) * rl.prompts_per_step, 0
      rng, key = jax.random.split(jax.random.fold_in(rng, step))
      while len(groups) < rl.prompts_per_step and rounds <= rl.max_refill_rounds:
        probs = [train[order[(cursor + i) % len(order)]] for i in range(rl.prompts_per_step)]
        cursor += rl.prompts_per_step * 1_000  # refills draw from elsewhere in the shuffled order
        key, sub = jax.random.split(key)
        r = rollout(base, model_config, tokenizer, probs, state["lora"], scale, config, dtype, sub)
        rows = r if rows is None else tuple(a + b if isinstance(a, list) else np.concatenate([a, b])
                                            for a, b in zip(rows, r))
        groups += list(probs)
        rounds += 1
        if not rl.dynamic_sampling:
          break
      t_gen = time.time() - t0
      prompts, comps, masks, off, texts = rows
      examples = [{"answer": str(p.answer)} for p in groups for _ in range(rl.group_size)]
      questions = [p.question for p in groups for _ in range(rl.group_size)]
      rewards, per_fn, errors = score_completions(dict(config.rewards), questions, texts, examples)
      t_score = time.time() - t0 - t_gen
      zero_var = np.asarray(zero_variance_groups(rewards, rl.group_size))
      keep = np.ones(len(groups), bool)
      if rl.dynamic_sampling and (~zero_var).sum() > 0:
        keep = ~zero_var
        keep &= np.cumsum(keep) <= rl.prompts_per_step
      rows_keep = np.repeat(keep, rl.group_size)
      adv = np.asarray(group_advantages(rewards[rows_keep], rl.group_size, scale=rl.advantage_scale))
      sel = np.flatnonzero(rows_keep)
      batch = build_rl_batch([prompts[i] for i in sel], [comps[i] for i in sel], [masks[i] for i in sel],
                             pad_id=pad_id, completion_width=round_up(rl.max_new_tokens, 32))
      batch["advantages"] = adv.astype(np.float32)
      batch["is_off_policy"] = off[sel]
      batch["old_logp"] = np.asarray(logp_fn(state["lora"], base, batch))
      if rl.beta:
        batch["ref_logp"] = np.asarray(logp_fn(None, base, batch))
      for _ in range(rl.num_iterations):
        state, metrics = step_fn(state, base, batch)
      metrics = {k: float(v) for k, v in jax.device_get(metrics).items()}
      t_update = time.time() - t0 - t_gen - t_score
      on = ~off[:len(rewards)]
      scalars = {**metrics, "reward_mean": float(rewards[on].mean()), "reward_std": float(rewards[on].std()),
                 "zero_variance_groups": float(zero_var.mean()),
                 "completion_length": float(np.mean([len(c) for c, o in zip(comps, off) if not o])),
                 "time_generate_s": t_gen, "time_score_s": t_score, "time_update_s": t_update,
                 **{f"reward_{k}": float(v[on].mean()) for k, v in per_fn.items()},
                 **{f"reward_errors_{k}": float(v) for k, v in errors.items()}}
      if step % config.eval_every == 0 or step == config.num_steps:
        scalars.update(evaluate_accuracy(base, model_config, tokenizer, held_out, state["lora"], scale,
                                         config, dtype))
        ckpt.save(int(state["step"]), state, {"config": config.to_dict()},
                  metrics={"eval_accuracy": scalars["eval_accuracy"]})
      writer.write_scalars(step, scalars)
      history.append({"step": step, "time_s": time.time() - t_start, **scalars})
      bar.set_postfix(reward=f"{scalars['reward_mean']:.3f}", acc=scalars.get("eval_accuracy", ""))
      bar.update(1)
      if stop:
        ckpt.save(int(state["step"]), state, {"config": config.to_dict()})
        break
  bar.close()
  writer.close()
  ckpt.close()
  lora_lib.export_peft(state["lora"], lora_cfg, model_config, os.path.join(workdir, "adapter"),
                       base_model_name_or_path=str(config.model.source))
  with open(os.path.join(workdir, "history.json"), "w") as f:
    json.dump(history, f, indent=1)
  logging.info("wrote %s", workdir)
  return {"history": history, "workdir": workdir}

