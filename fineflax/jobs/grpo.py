"""GRPO-family RL job on generated arithmetic tasks: GRPO / DAPO / Dr. GRPO, LUFFY, ExGRPO.

Each step: pick `prompts_per_step` questions; roll out each group of `group_size` rows from base+LoRA,
where LUFFY replaces `n_off` rows by solver traces and ExGRPO (once the solve rate passes its threshold)
takes `experience_share` of the questions from its buffer and replaces one row of each by the stored
correct trajectory of lowest entropy under the current policy. Then score, form group advantages,
optionally drop zero-variance groups and refill (DAPO), recompute old/ref log-probs, and update.
"""
from __future__ import annotations

import json
import os
import time

import jax
import numpy as np
from tqdm import tqdm

from fineflax import lora as lora_lib
from fineflax.io import atomic_write_text
from fineflax.jobs.common import compute_dtype, make_workdir, setup_model
from fineflax.rewards import score_completions
from fineflax.rl import groups as G
from fineflax.rl.advantages import dapo_overlong_penalty, group_advantages, zero_variance_groups
from fineflax.rl.experience import ExperienceBuffer, experience_split, replay_active
from fineflax.rl.rollout import build_rl_batch, round_up
from fineflax.rl.step import make_rl_fns
from fineflax.rl.tasks import generate_problems
from fineflax.rl.traces import load_traces
from fineflax.sampling import format_chat, generate
from fineflax.train.checkpoint import Checkpointer
from fineflax.train.metric_writer import MetricWriter
from fineflax.train.optim import make_optimizer
from fineflax.train.sft_step import init_state
from fineflax.train.signals import StopRequested


def prompt_ids(tokenizer, system_prompt: str, question: str, assistant_prefix: str = "") -> list[int]:
  """Chat-formatted system + user turns, the assistant header, then `assistant_prefix` (prefilled)."""
  messages = [{"role": "system", "content": system_prompt}, {"role": "user", "content": question}]
  return tokenizer(format_chat(tokenizer, messages) + assistant_prefix, add_special_tokens=False)["input_ids"]


def trace_ids(tokenizer, solution: str, eos_id: int, assistant_prefix: str = "") -> list[int]:
  """An off-policy trace as completion tokens: the worked solution (less the prefilled
  `assistant_prefix` it starts with, if any), then end of turn."""
  if assistant_prefix and solution.startswith(assistant_prefix):
    solution = solution[len(assistant_prefix):]
  return tokenizer(solution, add_special_tokens=False)["input_ids"] + [eos_id]


class Trainer:
  """Holds the frozen base, jitted functions and settings of one RL run; methods are the loop's steps."""

  def __init__(self, config):
    self.config, self.rl = config, config.rl
    self.dtype = compute_dtype(config)
    rl = self.rl
    if rl.objective not in ("grpo", "luffy", "exgrpo"):
      raise ValueError(f"config.rl.objective={rl.objective!r}; choose grpo, luffy or exgrpo")
    if rl.objective == "luffy" and not 0 < rl.n_off < rl.group_size:
      raise ValueError(f"config.rl.n_off={rl.n_off} must be in [1, group_size) for LUFFY")
    self.n_off = rl.n_off if rl.objective == "luffy" else 0
    self.base, self.model_config, self.tok, self.lora_cfg, lora = setup_model(config)
    self.scale = lora_lib.lora_scale(self.lora_cfg)
    self.optimizer = make_optimizer(config.optimizer)
    loss_kwargs = dict(epsilon_low=rl.epsilon_low, epsilon_high=rl.epsilon_high,
                       dual_clip=rl.dual_clip or None, beta=rl.beta, entropy_coef=rl.entropy_coef,
                       agg_mode=rl.agg_mode, max_len=rl.max_new_tokens)
    loss_kwargs.update({"grpo": dict(clip=rl.clip), "luffy": dict(gamma=rl.luffy_gamma, on_policy_clip=rl.clip),
                        "exgrpo": dict(replay_beta=rl.get("exgrpo_beta", 0.1), on_policy_clip=rl.clip)
                        }[rl.objective])
    fwd = dict(model_config=self.model_config, lora_scale=self.scale, remat=config.model.remat,
               dtype=self.dtype, logits_chunk=config.model.logits_chunk,
               temperature=rl.temperature)
    self.step_fn, self.logp_fn = make_rl_fns(self.optimizer, objective=rl.objective,
                                             loss_kwargs=loss_kwargs, fwd_kwargs=fwd)
    self.state = init_state(lora, self.optimizer, config.seed)
    self.eos = self.model_config.eos_token_ids[0]
    self.pad_id = self.tok.pad_token_id if self.tok.pad_token_id is not None else self.eos
    self.buffer = ExperienceBuffer(rl.group_size, sigma=rl.get("exgrpo_sigma", 1.0))
    self.traces = None  # question -> off-policy response; None = the solver's worked solutions
    if self.n_off and rl.get("traces_path"):
      self.traces = {t.question: t.response for t in load_traces(rl.traces_path)}
    self.solve_rate = 0.0

  eval_metric = "eval_accuracy"  # the evaluation key that picks the best checkpoint

  def checkpoint_meta(self) -> dict:
    """What a checkpoint stores beside the state (restored by `restore_meta`)."""
    return {"buffer": self.buffer.state_dict(), "solve_rate": self.solve_rate, "config": self.config.to_dict()}

  def restore_meta(self, meta: dict) -> None:
    self.buffer = ExperienceBuffer.from_state_dict(meta["buffer"])
    self.solve_rate = meta["solve_rate"]

  def eval_summary(self, m: dict) -> str:
    return f"held-out accuracy {m['eval_accuracy']:.3f}"

  def prompt(self, problem) -> list[int]:
    task = self.config.task
    return prompt_ids(self.tok, task.system_prompt, problem.question, task.assistant_prefix)

  def sample(self, prompts, rng, greedy=False):
    rl = self.rl
    return generate(self.base, self.model_config, prompts, max_new_tokens=rl.max_new_tokens,
                    temperature=0.0 if greedy else rl.temperature, top_p=rl.top_p, tokenizer=self.tok,
                    rng=rng, lora=self.state["lora"], lora_scale=self.scale, dtype=self.dtype)

  def evaluate(self, problems) -> dict:
    """Greedy held-out accuracy (config.task.accuracy_reward = 1), in batches of eval_batch_size."""
    correct, lengths = [], []
    for i in range(0, len(problems), self.config.eval_batch_size):
      chunk = problems[i:i + self.config.eval_batch_size]
      out = self.sample([self.prompt(p) for p in chunk], None, greedy=True)
      total, _, _ = score_completions({self.config.task.accuracy_reward: 1.0},
                                      [p.question for p in chunk], out.texts,
                                      [{"answer": str(p.answer)} for p in chunk])
      correct += list(total)
      lengths += list(out.lengths)
    return {"eval_accuracy": float(np.mean(correct)), "eval_completion_length": float(np.mean(lengths))}

  def mean_entropy(self, prompt, trajectories) -> np.ndarray:
    """Mean token entropy of stored trajectories under the current policy (ExGRPO selection)."""
    comps = [t.tokens.tolist() for t in trajectories]
    batch = build_rl_batch([prompt.tolist()] * len(comps), comps, [[1.0] * len(c) for c in comps],
                           pad_id=self.pad_id, completion_width=round_up(self.rl.max_new_tokens, 32))
    _, ent = self.logp_fn(self.state["lora"], self.base, batch)
    ent, mask = np.asarray(ent), batch["mask"]
    return (ent * mask).sum(1) / np.maximum(mask.sum(1), 1)

  def rollout(self, problems, qids, rng) -> dict:
    """Rows of len(problems) groups; questions whose qid is in the buffer get an ExGRPO replay row."""
    rl = self.rl
    replay = [q is not None for q in qids]
    guides = [(p.solution if self.traces is None else self.traces.get(p.question)) if self.n_off else None
              for p in problems]
    n_off = [self.n_off if g is not None else 0 for g in guides]  # no trace: one more on-policy row
    n_on = [rl.group_size - n - int(r) for n, r in zip(n_off, replay)]
    prompts1 = [self.prompt(p) for p in problems]
    prompts = [p for p, n in zip(prompts1, n_on) for _ in range(n)]
    on = G.sampled_rows(prompts, self.sample(prompts, rng), rl.mask_truncated)
    rows, start = G.empty_rows(), 0
    for g, p in enumerate(problems):
      G.extend(rows, {f: on[f][start:start + n_on[g]] for f in G.FIELDS})
      start += n_on[g]
      for _ in range(n_off[g]):
        ids = trace_ids(self.tok, guides[g], self.eos,
                        self.config.task.assistant_prefix)[:rl.max_new_tokens]
        G.extend(rows, G.fixed_row(prompts1[g], ids, guides[g]))
      if replay[g]:
        t = self.buffer.select_trajectory(qids[g], self.mean_entropy)
        G.extend(rows, G.fixed_row(prompts1[g], t.tokens.tolist(), self.tok.decode(t.tokens),
                                   t.logp.tolist()))
    return rows

  def choose(self, train, order, cursor, np_rng):
    """(problems, buffer qids or None) for one rollout round; ExGRPO mixes in buffer questions."""
    rl = self.rl
    n_exp = 0
    if rl.objective == "exgrpo" and replay_active(self.solve_rate, rl.exgrpo_threshold):
      n_exp = min(experience_split(rl.prompts_per_step, rl.experience_share)[0], len(self.buffer))
    qids = self.buffer.sample_questions(n_exp, np_rng) if n_exp else []
    fresh = [int(order[(cursor + i) % len(order)]) for i in range(rl.prompts_per_step - n_exp)]
    return [train[int(q)] for q in qids] + [train[i] for i in fresh], qids + [None] * len(fresh), \
        [int(q) for q in qids] + fresh

  def collect(self, train, order, cursor, rng, np_rng) -> dict:
    """One step's scored rollout groups; with DAPO dynamic sampling, extra rounds until enough groups
    have reward variance (or `max_refill_rounds` run out).

    Returns rows, rewards (shaped), correct (task success before shaping), idx (problem indices),
    zero_var (per group), per_fn and errors (reward-function breakdown).
    """
    rl, config = self.rl, self.config
    out = {"rows": G.empty_rows(), "rewards": np.zeros(0, np.float32), "correct": np.zeros(0, bool),
           "idx": [], "per_fn": {}, "errors": {}}
    for round_ in range(1 + (rl.max_refill_rounds if rl.dynamic_sampling else 0)):
      probs, qids, ids = self.choose(train, order, cursor + round_ * 7919, np_rng)
      new = self.rollout(probs, qids, jax.random.fold_in(rng, round_))
      questions = [p.question for p in probs for _ in range(rl.group_size)]
      examples = [{"answer": str(p.answer)} for p in probs for _ in range(rl.group_size)]
      r, per_fn, errors = score_completions(dict(config.rewards), questions, new["text"], examples)
      out["correct"] = np.concatenate([out["correct"], r >= 1.0])
      if rl.get("overlong_buffer", 0):  # DAPO soft overlong punishment, on-policy rows only
        lengths = np.array([len(c) for c in new["completion"]])
        penalty = np.asarray(dapo_overlong_penalty(lengths, rl.max_new_tokens, rl.overlong_buffer))
        r = r + penalty * ~np.asarray(new["off_policy"])
      G.extend(out["rows"], new)
      out["rewards"], out["idx"] = np.concatenate([out["rewards"], r]), out["idx"] + ids
      for k in per_fn:
        out["per_fn"][k] = np.concatenate([out["per_fn"].get(k, np.zeros(0)), per_fn[k]])
        out["errors"][k] = out["errors"].get(k, 0) + errors[k]
      out["zero_var"] = np.asarray(zero_variance_groups(out["rewards"], rl.group_size))
      if not rl.dynamic_sampling or (~out["zero_var"]).sum() >= rl.prompts_per_step:
        break
    return out

  def update_buffer(self, idx, rows, rewards, correct=None):
    """Record each group's fresh on-policy rows (ExGRPO); returns the batch solve rate.

    correct [N] bool: task success before reward shaping (default: reward >= 1)."""
    correct = np.asarray(rewards) >= 1.0 if correct is None else np.asarray(correct, bool)
    K = self.rl.group_size
    for g, q in enumerate(idx):
      sl = slice(g * K, (g + 1) * K)
      fresh = [i for i in range(sl.start, sl.stop) if not rows["off_policy"][i]]
      if len(fresh) == K:
        self.buffer.add_group(q, rows["prompt"][sl.start], [rows["completion"][i] for i in fresh],
                              [rows["rollout_logp"][i] for i in fresh], [float(rewards[i]) for i in fresh],
                              correct=[bool(correct[i]) for i in fresh])
    on = ~np.asarray(rows["off_policy"])
    return float(correct[on].mean())

  def train_step(self, rows, rewards, keep_groups) -> dict:
    """Advantages over kept groups, old/ref log-probs, then num_iterations updates; returns metrics."""
    rl = self.rl
    sel = np.flatnonzero(np.repeat(keep_groups, rl.group_size))
    pick = lambda f: [rows[f][i] for i in sel]
    batch = build_rl_batch(pick("prompt"), pick("completion"), pick("loss_mask"), pad_id=self.pad_id,
                           completion_width=round_up(rl.max_new_tokens, 32))
    n = batch["completion"].shape[1]
    batch["advantages"] = np.asarray(group_advantages(rewards[sel], rl.group_size,
                                                      scale=rl.advantage_scale), np.float32)
    batch["is_off_policy"] = np.asarray(rows["off_policy"])[sel]
    if rl.objective == "exgrpo":
      batch["behaviour_logp"] = G.pad_ragged(pick("behaviour_logp"), n)
    batch["old_logp"] = np.asarray(self.logp_fn(self.state["lora"], self.base, batch)[0])
    if rl.beta:
      batch["ref_logp"] = np.asarray(self.logp_fn(None, self.base, batch)[0])
    for _ in range(rl.num_iterations):
      self.state, metrics = self.step_fn(self.state, self.base, batch)
    return {k: float(v) for k, v in jax.device_get(metrics).items()}


def train_loop(tr: Trainer, workdir: str, held_out, step_scalars, *, desc: str,
               eval_at_start: bool = True) -> list[dict]:
  """The RL loop shared by the jobs; returns the metric history (one dict per step, step 0 first).

  Resumes from WORKDIR/checkpoints (state + `tr.restore_meta`); a fresh run evaluates at step 0 when
  `eval_at_start`. Each step s = start+1..num_steps: scalars = step_scalars(s); every `eval_every` steps
  and at the end add `tr.evaluate(held_out)` and checkpoint (best by `tr.eval_metric`); write the
  scalars to WORKDIR/logs. SIGINT/SIGTERM checkpoints and stops after the current step.
  """
  config = tr.config
  ckpt = Checkpointer(os.path.join(workdir, "checkpoints"), keep_last=2, keep_best=1,
                      best_metric=tr.eval_metric, best_mode="max")
  restored = ckpt.restore(tr.state)
  if restored is not None:
    tr.state, meta = restored
    tr.restore_meta(meta)
  writer = MetricWriter(os.path.join(workdir, "logs"))
  start = int(tr.state["step"]) // config.rl.num_iterations
  history, t_start = [], time.time()
  save = lambda m=None: ckpt.save(int(tr.state["step"]), tr.state, tr.checkpoint_meta(), metrics=m)
  if start == 0 and eval_at_start:
    m = tr.evaluate(held_out)
    writer.write_scalars(0, m)
    history.append({"step": 0, "time_s": time.time() - t_start, **m})
    print(f"[step 0] {tr.eval_summary(m)}", flush=True)
  bar = tqdm(total=config.num_steps, initial=start, desc=desc, dynamic_ncols=True)
  with StopRequested() as stop:
    for step in range(start + 1, config.num_steps + 1):
      scalars = step_scalars(step)
      if step % config.eval_every == 0 or step == config.num_steps:
        scalars.update(tr.evaluate(held_out))
        save({tr.eval_metric: scalars[tr.eval_metric]})
      writer.write_scalars(step, scalars)
      history.append({"step": step, "time_s": time.time() - t_start, **scalars})
      bar.set_postfix(reward=f"{scalars['reward_mean']:.3f}", **{tr.eval_metric: scalars.get(tr.eval_metric, "-")})
      bar.update(1)
      if stop:
        save()
        break
  bar.close()
  writer.close()
  ckpt.close()
  return history


def run(config, workdir: str | None) -> dict:
  workdir = make_workdir(config, workdir)
  rl = config.rl
  tr = Trainer(config)
  task = config.task
  sizes = dict(max_start=task.max_start, max_addend=task.max_addend)
  train = generate_problems(task.num_train, "train", tuple(task.num_steps), config.seed, **sizes)
  held_out = generate_problems(task.num_eval, "test", tuple(task.num_steps), task.eval_seed,
                               **sizes)
  order = np.random.default_rng(config.seed).permutation(len(train))
  np_rng = np.random.default_rng(config.seed + 1)
  rng = jax.random.PRNGKey(config.seed + 7)

  def step_scalars(step: int) -> dict:
    t0 = time.time()
    b = tr.collect(train, order, (step - 1) * rl.prompts_per_step, jax.random.fold_in(rng, step), np_rng)
    rows, rewards, idx, zero_var, per_fn, errors = (b["rows"], b["rewards"], b["idx"], b["zero_var"],
                                                    b["per_fn"], b["errors"])
    t_gen = time.time() - t0
    tr.solve_rate = tr.update_buffer(idx, rows, rewards, b["correct"])
    keep = np.ones(len(idx), bool)
    if rl.dynamic_sampling and (~zero_var).any():
      keep = ~zero_var & (np.cumsum(~zero_var) <= rl.prompts_per_step)
    metrics = tr.train_step(rows, rewards, keep)
    on = ~np.asarray(rows["off_policy"])
    return {**metrics, "reward_mean": float(rewards[on].mean()), "reward_std": float(rewards[on].std()),
            "solve_rate": tr.solve_rate, "zero_variance_groups": float(zero_var.mean()),
            "buffer_questions": float(len(tr.buffer)),
            "completion_length": float(np.mean([len(c) for c, o in zip(rows["completion"], on) if o])),
            "time_rollout_s": t_gen, "time_update_s": time.time() - t0 - t_gen,
            **{f"reward_{k}": float(v[on].mean()) for k, v in per_fn.items()},
            **{f"reward_errors_{k}": float(v) for k, v in errors.items()}}

  history = train_loop(tr, workdir, held_out, step_scalars, desc=rl.objective)
  export_run(tr, config, workdir, history)
  return {"history": history, "workdir": workdir}


def export_run(tr: Trainer, config, workdir: str, history: list[dict]) -> None:
  """The LoRA as a PEFT adapter in WORKDIR/adapter, the metric history in WORKDIR/history.json (atomic)."""
  lora_lib.export_peft(tr.state["lora"], tr.lora_cfg, tr.model_config, os.path.join(workdir, "adapter"),
                       base_model_name_or_path=str(config.model.source))
  atomic_write_text(os.path.join(workdir, "history.json"), json.dumps(history, indent=1))
