"""Scalars to TensorBoard event files and a JSONL log on every machine.

TensorBoard goes through `clu.metric_writers` when tensorflow is installed, else through tensorboardX.
"""
from __future__ import annotations

import importlib.util
import json
import math
import os
import sys
import time


class MetricWriter:
  """write_scalars(step, {name: value}) -> `<logdir>/metrics.jsonl` + TensorBoard events in `logdir`."""

  def __init__(self, logdir: str):
    os.makedirs(logdir, exist_ok=True)
    self.logdir = logdir
    self._jsonl = open(os.path.join(logdir, "metrics.jsonl"), "a", buffering=1)
    if importlib.util.find_spec("tensorflow") is not None:
      from clu import metric_writers
      self._clu = metric_writers.create_default_writer(logdir, asynchronous=False)
      self._tbx = None
    else:
      self._clu, self._tbx = None, _tensorboardx_writer()(logdir)

  def write_scalars(self, step: int, scalars: dict) -> None:
    clean = {k: float(v) for k, v in scalars.items()}
    self._jsonl.write(json.dumps({"step": int(step), "time": time.time(), **{
        k: (v if math.isfinite(v) else str(v)) for k, v in clean.items()}}) + "\n")
    if self._clu is not None:
      self._clu.write_scalars(int(step), clean)
    else:
      for k, v in clean.items():
        self._tbx.add_scalar(k, v, int(step))

  def write_text(self, step: int, name: str, text: str) -> None:
    if self._clu is not None:
      self._clu.write_texts(int(step), {name: text})
    else:
      self._tbx.add_text(name, text, int(step))

  def flush(self) -> None:
    self._jsonl.flush()
    (self._clu or self._tbx).flush()

  def close(self) -> None:
    self.flush()
    self._jsonl.close()
    (self._clu or self._tbx).close()


def _tensorboardx_writer():
  """tensorboardX.SummaryWriter. Its writer module imports torch when installed, only to accept torch tensors
  (scalars and text need none): in a process that has not loaded torch it is imported with `import torch`
  failing, which saves seconds of start-up per job process (tests/test_train_infra.py checks)."""
  if "torch" in sys.modules or "tensorboardX" in sys.modules:
    from tensorboardX import SummaryWriter
    return SummaryWriter
  sys.modules["torch"] = None  # makes `import torch` raise ImportError
  try:
    from tensorboardX import SummaryWriter
  finally:
    del sys.modules["torch"]
  return SummaryWriter


def read_jsonl(path: str) -> list[dict]:
  """The records of a metrics.jsonl file."""
  with open(path) as f:
    return [json.loads(line) for line in f if line.strip()]
