"""The one training loop of every job (SFT, RL, distillation): the loop knows no objective.

A job gives `Hooks`: `step(state, step) -> (state, scalars)` (one optimizer update or one RL iteration;
`scalars["loss"]` is checked for finiteness), `evaluate(state) -> metrics`, and the JSON-able extra state
it checkpoints beside the train state (`meta` / `restore_meta`: data position, experience buffer).

  resume      from the newest step of WORKDIR/checkpoints (orbax) that restores (damaged newer steps are named
              and skipped, `Checkpointer.restore_newest`); a config that changed in a field that
              changes the run (not its length or logging) is refused before restoring (`run_config`).
  evaluate    at step 0 (optional), every `eval_every` steps and at the last step.
  checkpoint  every `checkpoint.every` steps, at evaluations, at the end and on SIGINT/SIGTERM; keeps
              `checkpoint.keep_last` latest and `checkpoint.keep_best` best by `hooks.eval_metric`.
              A failed write is logged and retried at the next save; 3 failures in a row stop the run.
  non-finite  a step whose loss is NaN/inf is discarded; the run stops with the previous state (the last
              good checkpoint stays on disk). A step that donated the previous state (full training:
              its arrays are deleted) left its params and moments unchanged on a non-finite loss
              (`fineflax.train.grad_accum.apply_gradients(skip_nonfinite=True)`): its returned state
              is kept instead.
  metrics     WORKDIR/logs/metrics.jsonl + TensorBoard events, a tqdm bar, WORKDIR/history.json.
  processes   with several (`fineflax.train.distributed`) every process steps and checkpoints (orbax
              writes collectively); only process 0 writes config.json, metrics, history and summary.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import time
from typing import Any, Callable

import jax
from tqdm import tqdm

from fineflax.io import atomic_write_text
from fineflax.train.checkpoint import Checkpointer
from fineflax.train.distributed import barrier, is_writer
from fineflax.train.metric_writer import MetricWriter, read_jsonl
from fineflax.train.run_config import check_resumable
from fineflax.train.signals import StopRequested

MAX_FAILED_WRITES = 3  # consecutive failed checkpoint writes before the run stops
EXIT_CODES = {"SIGINT": 130, "SIGTERM": 143}  # a stopped run exits like the signal (checkpoint saved)


@dataclasses.dataclass
class Hooks:
  """What a job gives the loop. `eval_metric` ranks checkpoints (best = max, or min with eval_mode)."""
  step: Callable[[Any, int], tuple[Any, dict]]
  evaluate: Callable[[Any], dict] = lambda state: {}
  eval_metric: str = ""
  eval_mode: str = "max"
  meta: Callable[[], dict] = dict
  restore_meta: Callable[[dict], None] = lambda meta: None
  postfix: tuple[str, ...] = ("loss",)  # scalars shown on the progress bar (plus eval_metric)
  loss_key: str = "loss"  # the scalar whose NaN/inf stops the run


@dataclasses.dataclass
class LoopResult:
  """state: the last good state; status: "completed" | "already complete" | "stopped: ..." ;
  exit_code: 0, 130/143 (stopped by a signal, checkpoint saved) or 1 (stopped by an error)."""
  state: Any
  history: list[dict]
  status: str
  step: int
  exit_code: int = 0
  resumed_from: int = 0
  elapsed_s: float = 0.0


class _NoWriter:
  """The metric writer of processes other than 0: writes nothing."""
  write_scalars = write_text = lambda self, *args: None
  flush = close = lambda self: None


def read_history(workdir: str) -> list[dict]:
  """The per-step records a run logged (WORKDIR/logs/metrics.jsonl), the latest record per step."""
  path = os.path.join(workdir, "logs", "metrics.jsonl")
  if not os.path.exists(path):
    return []
  by_step = {r["step"]: r for r in read_jsonl(path)}
  return [by_step[s] for s in sorted(by_step)]


def donated(state) -> bool:
  """Whether a step deleted arrays of `state` (it donated them, `jax.jit(donate_argnums=...)`)."""
  return any(isinstance(x, jax.Array) and x.is_deleted() for x in jax.tree.leaves(state))


def already_complete_line(step: int, num_steps: int, workdir: str) -> str:
  return f"already complete at step {step} of {num_steps}; nothing to do ({workdir})"


def train_loop(hooks: Hooks, state, config, workdir: str, *, num_steps: int, desc: str,
               eval_every: int, eval_at_start: bool = False) -> LoopResult:
  """Runs steps start+1..num_steps (start = the restored step) and returns the `LoopResult`.

  `config` is the run's ConfigDict: its `checkpoint` section gives every/keep_last/keep_best, and it
  is saved to WORKDIR/config.json (the resume check compares against it).
  """
  t_start = time.time()
  ck = config.checkpoint
  check_resumable(config, workdir, write=False)  # every process refuses a changed config alike
  barrier("fineflax_config_checked")
  if is_writer():  # then process 0 moves an old run aside (resume=False) and saves config.json
    check_resumable(config, workdir)
  barrier("fineflax_config_saved")
  ckpt = Checkpointer(os.path.join(workdir, "checkpoints"), keep_last=ck.keep_last, keep_best=ck.keep_best,
                      best_metric=hooks.eval_metric, best_mode=hooks.eval_mode)
  restored = ckpt.restore_newest(state)  # skips (and names) damaged newer steps
  start = 0
  if restored is not None:
    start, state, meta = restored
    hooks.restore_meta(meta.get("job", {}))
  if start >= num_steps and restored is not None:
    print(already_complete_line(start, num_steps, workdir), flush=True)
    ckpt.close()
    return LoopResult(state, read_history(workdir), "already complete", start, 0, start, 0.0)
  if start:
    print(f"resuming from step {start} of {num_steps} ({ckpt.directory})", flush=True)
  writer = MetricWriter(os.path.join(workdir, "logs")) if is_writer() else _NoWriter()
  history = [] if not start else read_history(workdir)
  save = lambda step, metrics=None: ckpt.save(step, state, {"job": hooks.meta()}, metrics=metrics)
  if start == 0 and eval_at_start:
    m = hooks.evaluate(state)
    writer.write_scalars(0, m)
    history.append({"step": 0, "time_s": time.time() - t_start, **m})
    print(f"[step 0] " + ", ".join(f"{k} {v:.4g}" for k, v in m.items()), flush=True)
  status, exit_code, failed_writes, step = "completed", 0, 0, start
  bar = tqdm(total=num_steps, initial=start, desc=desc, dynamic_ncols=True, disable=not is_writer())
  with StopRequested() as stop:
    for step in range(start + 1, num_steps + 1):
      new_state, scalars = hooks.step(state, step)
      scalars = {k: float(v) for k, v in scalars.items()}
      loss = scalars.get(hooks.loss_key, 0.0)
      if not math.isfinite(loss):
        status, exit_code, step = f"stopped: non-finite loss {loss} at step {step}", 1, step - 1
        state = new_state if donated(state) else state  # the donating step skipped its update
        break
      state = new_state
      evaluating = step % eval_every == 0 or step == num_steps
      if evaluating:
        scalars.update(hooks.evaluate(state))
      writer.write_scalars(step, scalars)
      history.append({"step": step, "time_s": time.time() - t_start, **scalars})
      shown = [k for k in (*hooks.postfix, hooks.eval_metric) if k in scalars]
      bar.set_postfix({k: f"{scalars[k]:.4g}" for k in shown})
      bar.update(1)
      stopping = bool(stop) and step < num_steps  # polled once a step; the last step completes the run
      if step % ck.every == 0 or evaluating or stopping:
        best = {hooks.eval_metric: scalars[hooks.eval_metric]} if hooks.eval_metric in scalars else None
        failed_writes = 0 if save(step, best) else failed_writes + 1
        if failed_writes >= MAX_FAILED_WRITES:
          status, exit_code = f"stopped: {failed_writes} checkpoint writes in a row failed (disk full?)", 1
          break
      if stopping:
        status, exit_code = f"stopped by {stop.signal_name} at step {step}", EXIT_CODES[stop.signal_name]
        break
  bar.close()
  writer.close()
  latest = ckpt.latest_step()
  ckpt.close()
  if status != "completed":
    print(f"\n{status}; the last good checkpoint is step {latest} in {ckpt.directory}", flush=True)
  if is_writer():
    atomic_write_text(os.path.join(workdir, "history.json"), json.dumps(history, indent=1))
  return LoopResult(state, history, status, step, exit_code, start, time.time() - t_start)


def write_summary(workdir: str, result: LoopResult, **extra) -> dict:
  """WORKDIR/summary.json (atomic) and the closing lines every job prints: status, final metrics, time,
  adapter (or full model), logs and checkpoints."""
  last = next((h for h in reversed(result.history) if h.get("step") == result.step), {})
  final = {k: v for k, v in last.items() if k not in ("step", "time", "time_s")}
  summary = {"status": result.status, "step": result.step, "exit_code": result.exit_code,
             "elapsed_s": round(result.elapsed_s, 1), "workdir": workdir, "final_metrics": final,
             "logs": os.path.join(workdir, "logs"), "checkpoints": os.path.join(workdir, "checkpoints"),
             **extra}
  if not is_writer():
    return summary
  atomic_write_text(os.path.join(workdir, "summary.json"), json.dumps(summary, indent=2, default=str))
  lines = [f"status: {result.status} (step {result.step})", f"time: {result.elapsed_s:.0f} s"]
  if final:
    lines.append("final: " + ", ".join(f"{k} {v:.4g}" for k, v in final.items()
                                       if isinstance(v, (int, float)) and not k.startswith("time")))
  lines += [f"{k}: {summary[k]}" for k in ("adapter", "model") if k in summary]
  lines += [f"logs: {summary['logs']} (metrics.jsonl; TensorBoard events: pip install tensorboard && "
            f"tensorboard --logdir {summary['logs']})", f"checkpoints: {summary['checkpoints']}"]
  print("\n" + "\n".join(lines), flush=True)
  logging.info("summary written to %s", os.path.join(workdir, "summary.json"))
  return summary
