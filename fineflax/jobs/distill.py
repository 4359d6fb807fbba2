"""Distillation job: the student's fresh LoRA (on its quantised base), or all its parameters
(config.train.params="full"), learns a teacher's token distributions.

Each step: the teacher samples completions to `prompts_per_step` training questions from its own prompt
(with `distill.only_correct`, completions with a wrong answer get a zero mask: rejection-sampled KD);
the student reads the same completions after its own prompt; one `distill_step` (forward KL, see
fineflax/train/distill_step.py); with `train.micro_batch_tokens` > 0 its gradient is accumulated over
micro-batches of the step's rows, as many padded rows per device as fit that many tokens
(`make_distill_micro_step`; the same update as the whole batch). Held-out greedy accuracy of the teacher
and of the student before and after goes to summary.json; the adapter is exported in PEFT format (full
training: a merged HF folder). On the mesh (config.mesh) the rows are split over every device, the bases
over fsdp, full parameters and their optimizer state over fsdp (`fineflax.train.trainable`). The loop
(resume, evaluation of the student every `eval_every` steps, checkpoints, stop handling) is
`fineflax.train.loop`.
"""
from __future__ import annotations

import copy
import time

import jax
import numpy as np

from fineflax import lora as lora_lib
from fineflax.config_checks import lookup, non_negative_int, require
from fineflax.envs.arithmetic import ArithmeticEnv
from fineflax.jobs import resolve
from fineflax.lora.peft_io import peft_files
from fineflax.models import load
from fineflax.models.load import check_source
from fineflax.rewards.registry import score_completions
from fineflax.rl import rows as R
from fineflax.rl.batch import build_rl_batch, pad_rows, round_up
from fineflax.rl.minibatch import split_rows
from fineflax.rl.policy import Policy
from fineflax.rl.update import shard_update_batch
from fineflax.mesh import make_mesh, replicate, shard_params
from fineflax.train.distill_step import make_distill_fn, make_distill_micro_step, micro_rows
from fineflax.train.loop import Hooks, train_loop
from fineflax.train.model_setup import compute_dtype, setup_model
from fineflax.train.optim import make_optimizer
from fineflax.train.trainable import export_trained, init_placed_state, moment_dtype, pin_state, split_model
from fineflax.train.workdir import finish_run, make_workdir, preflight


def setup_teacher(config, student_base, model_config, dtype):
  """(params, model config, lora, lora scale) of the teacher (see configs/distill.py); `student_base`:
  the student's frozen base (full training: its frozen initial parameters)."""
  t = config.teacher
  if t.source:
    params, t_config, _ = load(t.source, dtype=dtype, with_tokenizer=False, quant=t.quant)
    if t_config.vocab_size != model_config.vocab_size:
      raise ValueError(f"config.teacher.source={t.source!r}: vocabulary {t_config.vocab_size} != the student's "
                       f"{model_config.vocab_size}")
  else:
    params, t_config = student_base, model_config
  if not t.adapter:
    return params, t_config, None, 1.0
  lora, cfg = lora_lib.import_peft(t.adapter, t_config)
  return params, t_config, lora, lora_lib.lora_scale(cfg)


def check_teacher(teacher) -> None:
  """The teacher's adapter folder and model path (config.teacher.adapter / .source), before any model loads:
  FileNotFoundError naming the field and the value."""
  for field, check in (("adapter", peft_files), ("source", check_source)):
    value = teacher.get(field, "")
    if value:
      try:
        check(value)
      except FileNotFoundError as e:
        raise FileNotFoundError(f"config.teacher.{field}={value!r}: {e}") from None


def validate(config) -> None:
  """This job's part of `fineflax.jobs.resolve.validate`: the micro-batch budget (whether a row fits it is
  checked at the first step, when the padded width is known)."""
  require(config, "train.micro_batch_tokens", *non_negative_int(" (0 = the whole batch at once)"))


def run(config, workdir: str | None) -> dict:
  resolve.validate(config)
  check_teacher(config.teacher)
  done = preflight(config, workdir, config.num_steps)  # before the models load
  if done is not None:
    return done
  dtype = compute_dtype(config)
  task, dc, tc = config.task, config.distill, config.teacher
  base, model_config, tok, lora_cfg, lora = setup_model(config)
  scale = lora_lib.lora_scale(lora_cfg)
  mesh = make_mesh(config.mesh.data, config.mesh.fsdp) if config.get("mesh") is not None else None
  trainable = split_model(config, base, lora, keep_reference=not tc.source).place(mesh)
  base = trainable.base  # None in full training
  t_params, t_config, t_lora, t_scale = setup_teacher(config, base if base is not None else trainable.reference,
                                                      model_config, dtype)
  if mesh is not None and tc.source:
    t_params = shard_params(t_params, mesh)
  if mesh is not None and t_lora is not None:
    t_lora = replicate(t_lora, mesh)
  t_system = tc.system_prompt or task.system_prompt
  optimizer = make_optimizer(config.optimizer, moment_dtype(config))
  micro_tokens = lookup(config, "train.micro_batch_tokens", 0)
  make = make_distill_micro_step if micro_tokens else make_distill_fn
  step_fn = make(optimizer, model_config=model_config, teacher_config=t_config, teacher_lora_scale=t_scale,
                 donate=trainable.donate, lora_scale=scale, tau=dc.tau, top_k=dc.top_k, remat=config.model.remat,
                 dtype=dtype, logits_chunk=config.model.logits_chunk)
  env = ArithmeticEnv(config, tok)  # the student's prompts; the teacher reads `t_system`
  teacher_cfg = copy.deepcopy(config)
  teacher_cfg.task.system_prompt = t_system
  teacher_env = ArithmeticEnv(teacher_cfg, tok)
  order = np.random.default_rng(config.seed).permutation(len(env.train_items))
  rng = jax.random.PRNGKey(config.seed + 7)
  width = round_up(tc.max_new_tokens, 16)
  teacher = Policy(t_params, t_config, tok, t_lora, t_scale, dtype, tc.temperature or 1.0, 1.0,
                   tc.max_new_tokens, mesh)

  def student(params) -> Policy:  # the student of these trainable params, with the evaluation budget
    weights, lora_ = trainable.weights(params)
    return Policy(weights, model_config, tok, lora_, scale, dtype, max_new_tokens=task.eval_max_new_tokens,
                  mesh=mesh)
  state = init_placed_state(trainable.params, optimizer, config.seed, mesh, trainable.full)
  if mesh is not None and not micro_tokens:
    step_fn = pin_state(step_fn, state, trainable.donate)
  workdir = make_workdir(config, workdir)

  def step(state, i: int):
    t0 = time.time()
    problems = [env.train_items[order[((i - 1) * dc.prompts_per_step + j) % len(order)]]
                for j in range(dc.prompts_per_step)]
    t_prompts = [teacher_env.prompt(p) for p in problems]
    out = teacher.sample(t_prompts, jax.random.fold_in(rng, i), greedy=not tc.temperature)
    rows = R.sampled_rows(t_prompts, out)
    correct, _, _ = score_completions({task.accuracy_reward: 1.0}, [p.question for p in problems], out.texts,
                                      [env.example(p) for p in problems])
    masks = rows["loss_mask"]
    if dc.only_correct:  # rejection-sampled distillation: the KL only on completions with the right answer
      masks = [m if c > 0 else [0.0] * len(m) for m, c in zip(masks, correct)]
    s_batch = build_rl_batch([env.prompt(p) for p in problems], rows["completion"], masks, pad_id=teacher.pad_id,
                             completion_width=width, width_multiple=16)
    t_batch = build_rl_batch(t_prompts, rows["completion"], masks, pad_id=teacher.pad_id, completion_width=width,
                             width_multiple=16)
    batch = dict(s_batch, teacher_tokens=t_batch["tokens"], teacher_attention_mask=t_batch["attention_mask"],
                 teacher_positions=t_batch["positions"])
    place = (lambda b: shard_update_batch(b, mesh)) if mesh is not None else (lambda b: b)  # rows over devices
    if micro_tokens:  # micro-batches of whole rows (the last padded with mask-0 rows), one update
      devices = mesh.devices.size if mesh is not None else 1
      row_width = max(batch["tokens"].shape[1], batch["teacher_tokens"].shape[1])
      mb_rows = micro_rows(batch["tokens"].shape[0], row_width, micro_tokens, devices)
      batch = [place(mb) for mb in split_rows(pad_rows(batch, mb_rows), mb_rows)]
    else:
      batch = place(batch)
    state, metrics = step_fn(state, base, t_params, t_lora, batch)
    if micro_tokens:
      metrics = dict(metrics, micro_batches=len(batch))
    return state, {**{k: float(v) for k, v in jax.device_get(metrics).items()},
                   "teacher_sample_accuracy": float(np.mean(correct)), "step_time_s": time.time() - t0}

  def evaluate(state):
    m = env.evaluate(student(state["params"]), env.eval_items)
    return {"eval_accuracy": m["eval_accuracy"], "eval_completion_length": m["eval_completion_length"]}

  teacher_eval = {}
  if config.eval_at_start:
    t_eval = teacher_env.evaluate(Policy(t_params, t_config, tok, t_lora, t_scale, dtype,
                                         max_new_tokens=task.eval_max_new_tokens, mesh=mesh), teacher_env.eval_items)
    teacher_eval = {"teacher_eval_accuracy": t_eval["eval_accuracy"]}
    print(f"teacher held-out accuracy {t_eval['eval_accuracy']:.3f}", flush=True)
  hooks = Hooks(step=step, evaluate=evaluate, eval_metric="eval_accuracy", loss_key="kl",
                postfix=("kl", "teacher_sample_accuracy"))
  result = train_loop(hooks, state, config, workdir,
                      num_steps=config.num_steps, desc="distill", eval_every=config.eval_every,
                      eval_at_start=config.eval_at_start)
  evals = [h for h in result.history if "eval_accuracy" in h]
  extra = {**teacher_eval, "num_eval": len(env.eval_items)}
  if evals:
    extra.update(student_before=evals[0]["eval_accuracy"], student_after=evals[-1]["eval_accuracy"])
  return finish_run(workdir, result, lambda: export_trained(trainable, result.state["params"], lora_cfg=lora_cfg,
                                                            model_config=model_config, tokenizer=tok,
                                                            config=config, workdir=workdir), **extra)
