"""A run's folder: making it, the checks made before the model loads (`preflight`) and the run summary."""
from __future__ import annotations

import os
import time

from fineflax.io import read_json
from fineflax.lora.peft_io import peft_files
from fineflax.train.checkpoint import latest_checkpoint_step
from fineflax.train.loop import LoopResult, already_complete_line, write_summary
from fineflax.train.run_config import check_resumable, check_workdir


def make_workdir(config, workdir: str | None) -> str:
  workdir = workdir or os.path.join("runs", f"{config.job}-{time.strftime('%Y%m%d-%H%M%S')}")
  check_workdir(workdir)
  os.makedirs(workdir, exist_ok=True)
  return workdir


def preflight(config, workdir: str | None, num_steps: int) -> dict | None:
  """The checks that need no weights, made before the model loads: the PEFT folder of `lora.init_from`
  exists, the workdir can be made (`WorkdirError`), its checkpoints belong to this config
  (`ConfigChanged`; with resume=false the loop moves them aside later), and whether the run is already
  complete at `num_steps`: then the loop's "already complete" line is printed and the saved summary
  returned (None: the run has work to do)."""
  if config.get("lora") is not None and config.lora.get("init_from", ""):
    peft_files(config.lora.init_from)
  if workdir is None:  # a fresh runs/<job>-<time> folder
    return None
  check_workdir(workdir)
  check_resumable(config, workdir, write=False)
  step = latest_checkpoint_step(os.path.join(workdir, "checkpoints"))
  if step is None or step < num_steps or not config.get("resume", True):
    return None
  print(already_complete_line(step, num_steps, workdir), flush=True)
  return saved_summary(workdir, step)


def saved_summary(workdir: str, step: int) -> dict:
  """WORKDIR/summary.json of a run already complete (a stand-in naming the step if it was never written)."""
  path = os.path.join(workdir, "summary.json")
  return read_json(path) if os.path.exists(path) else {"status": "already complete", "step": step}


def finish_run(workdir: str, result: LoopResult, export, **extra) -> dict:
  """The run's summary: an already-complete run returns its saved summary and writes nothing; otherwise
  `export()` -> (summary key, path): ("adapter", PEFT folder) or ("model", merged HF folder)
  (`fineflax.train.trainable.export_trained`), then `write_summary`."""
  if result.status == "already complete":
    return saved_summary(workdir, result.step)
  key, path = export()
  return write_summary(workdir, result, **{key: path}, **extra)
