"""Safetensors files as NumPy arrays (bf16 via ml_dtypes), without torch; sharded checkpoints via the index."""
from __future__ import annotations

import json
import os
import pathlib
import struct
from typing import Mapping

import ml_dtypes
import numpy as np

from fineflax.io import atomic_path

_DTYPES = {"F64": np.float64, "F32": np.float32, "F16": np.float16, "BF16": ml_dtypes.bfloat16,
           "I64": np.int64, "I32": np.int32, "I16": np.int16, "I8": np.int8, "U8": np.uint8,
           "BOOL": np.bool_}
_NAMES = {np.dtype(v): k for k, v in _DTYPES.items()}


def read_safetensors(path: str | os.PathLike) -> dict[str, np.ndarray]:
  """All tensors of one .safetensors file, memory-mapped (read-only views)."""
  path = pathlib.Path(path)
  try:
    with open(path, "rb") as f:
      (n,) = struct.unpack("<Q", f.read(8))
      header = json.loads(f.read(n))
  except (OSError, struct.error, ValueError, UnicodeDecodeError) as e:
    raise ValueError(f"{path}: not a readable safetensors file ({e})") from e
  header.pop("__metadata__", None)
  data = np.memmap(path, dtype=np.uint8, mode="r", offset=8 + n)
  out = {}
  for name, info in header.items():
    if info["dtype"] not in _DTYPES:
      raise ValueError(f"{path}: tensor {name!r} has unsupported dtype {info['dtype']}")
    start, end = info["data_offsets"]
    if end > data.size:
      raise ValueError(f"{path}: tensor {name!r} runs past the end of the file (truncated file?)")
    out[name] = data[start:end].view(_DTYPES[info["dtype"]]).reshape(info["shape"])
  return out


def read_checkpoint(folder: str | os.PathLike) -> dict[str, np.ndarray]:
  """Every tensor of a Hugging Face folder: `model.safetensors`, or the shards its index names."""
  folder = pathlib.Path(folder)
  index = folder / "model.safetensors.index.json"
  if index.exists():
    shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    missing = [s for s in shards if not (folder / s).exists()]
    if missing:
      raise FileNotFoundError(f"{index}: shards missing from {folder}: {missing}")
  else:
    shards = sorted(p.name for p in folder.glob("*.safetensors"))
    if not shards:
      raise FileNotFoundError(f"{folder}: no *.safetensors files (pytorch .bin checkpoints are not read)")
  tensors: dict[str, np.ndarray] = {}
  for s in shards:
    tensors.update(read_safetensors(folder / s))
  return tensors


def write_safetensors(tensors: Mapping[str, np.ndarray], path: str | os.PathLike,
                      metadata: Mapping[str, str] | None = None) -> None:
  """Writes tensors atomically (tmp file + rename) in the safetensors layout."""
  path = pathlib.Path(path)
  header, offset, arrays = {}, 0, []
  for name in sorted(tensors):
    a = np.ascontiguousarray(np.asarray(tensors[name]))
    if a.dtype not in _NAMES:
      raise ValueError(f"tensor {name!r}: dtype {a.dtype} cannot be written to safetensors")
    header[name] = {"dtype": _NAMES[a.dtype], "shape": list(a.shape),
                    "data_offsets": [offset, offset + a.nbytes]}
    offset += a.nbytes
    arrays.append(a)
  if metadata:
    header["__metadata__"] = dict(metadata)
  blob = json.dumps(header, separators=(",", ":")).encode()
  blob += b" " * (-len(blob) % 8)
  with atomic_path(path) as tmp, open(tmp, "wb") as f:
    f.write(struct.pack("<Q", len(blob)))
    f.write(blob)
    for a in arrays:
      f.write(a.tobytes())
