"""What the three GRPO benchmark workers share (benchmarks/rl.py): the step's settings, the prompts, the
reward and a word-level tokenizer that maps "t<i>" <-> token id i, so every framework reads and writes the
same token ids without a hub download.

Import-light: neither jax nor torch is imported here.
"""
from __future__ import annotations

import time
import zlib

import numpy as np

EOS_ID, PAD_ID = 0, 1  # "<eos>", "<pad>"; prompt tokens are drawn from [2, vocab)
LORA_R, LORA_ALPHA = 16, 32.0
LINEARS = ("q", "k", "v", "o", "gate", "up", "down")
HF_TARGETS = tuple(f"{n}_proj" for n in LINEARS)
EPS_LOW, EPS_HIGH = 0.2, 0.28  # DAPO clip-higher
LR = 1e-5


def prompts(spec: dict) -> list[list[int]]:
  """`prompts` distinct random prompts of `prompt_len` token ids (seed 0); each framework samples
  `group` completions of each."""
  rng = np.random.default_rng(0)
  return rng.integers(2, spec["shape"]["vocab"], size=(spec["prompts"], spec["prompt_len"])).tolist()


def reward_of_tokens(tokens) -> float:
  """A deterministic pseudo-random reward in [0, 1) of a completion's token ids (crc32 of their text), so
  groups have reward variance and every framework does the same host work per row."""
  return (zlib.crc32(" ".join(map(str, tokens)).encode()) % 1000) / 1000.0


def text_of(ids) -> str:
  return " ".join(f"t{i}" for i in ids)


def reward_of_text(text: str) -> float:
  """`reward_of_tokens` of a completion decoded by `word_tokenizer` ("t5 t17 ..."; specials ignored)."""
  ids = [int(w[1:]) for w in text.split() if w.startswith("t") and w[1:].isdigit()]
  return reward_of_tokens(ids)


def word_tokenizer(vocab_size: int):
  """A transformers `PreTrainedTokenizerFast`: id 0 "<eos>", id 1 "<pad>", id i "t<i>" (whitespace-split,
  no BOS), so `tok(text_of(ids)).input_ids == ids`."""
  from tokenizers import Tokenizer, decoders, models, pre_tokenizers
  from transformers import PreTrainedTokenizerFast
  vocab = {"<eos>": EOS_ID, "<pad>": PAD_ID, **{f"t{i}": i for i in range(2, vocab_size)}}
  tk = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
  tk.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
  tk.decoder = decoders.WordPiece(prefix="##", cleanup=False)  # joins words with spaces
  tok = PreTrainedTokenizerFast(tokenizer_object=tk, eos_token="<eos>", pad_token="<pad>",
                                unk_token="<pad>", padding_side="left")
  return tok


class Split:
  """Wall-clock seconds per phase of each step: `with split.phase("rollout", sync): ...`."""

  def __init__(self):
    self.steps: list[dict[str, float]] = []

  def new_step(self):
    self.steps.append({})

  def add(self, name: str, seconds: float):
    if not self.steps:
      self.new_step()
    self.steps[-1][name] = self.steps[-1].get(name, 0.0) + seconds


def summarize(split: Split, warmup: int, total_key: str = "step") -> dict:
  """{"first": the first step's phases (compile / warm-up), "timed": the phases of the fastest step after
  `warmup` (best of N, robust to a one-off recompile in a timed step), "timed_mean": their mean,
  "timed_steps": their count, "all": every step}. A missing total is the sum of the phases."""
  steps = [dict(s) for s in split.steps]
  for s in steps:
    s.setdefault(total_key, sum(v for k, v in s.items() if k != total_key))
  timed = steps[warmup:]
  keys = sorted({k for s in timed for k in s})
  mean = {k: float(np.mean([s.get(k, 0.0) for s in timed])) for k in keys} if timed else {}
  best = min(timed, key=lambda s: s[total_key]) if timed else {}
  return {"first": steps[0] if steps else {}, "timed": best, "timed_mean": mean, "timed_steps": len(timed),
          "all": steps}


def now() -> float:
  return time.perf_counter()
