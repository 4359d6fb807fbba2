"""The engine's compiled programs: decode chunks, prefills and page copies, lowered ahead of time from
shape specs (`precompile`, `warm_up`: a server compiles nothing while it serves) and kept in one
process-wide least-recently-used cache shared by engines of the same model and pool shape.

`CompiledPrograms` is a mixin of `fineflax.engine.engine.Engine`; it reads the engine's params, pool, lora,
config, dtype, impl, attention, chunk_size, mesh, bucket rules (`_rows`, `_table_width`, `_eos_width`,
`_row_limit`) and `_signature`.
"""
from __future__ import annotations

import collections
import concurrent.futures
import os
import threading
from typing import Sequence as Seq

import jax
import jax.numpy as jnp

from fineflax.engine import device, tensor_parallel as tp
from fineflax.engine.decode import bucket
from fineflax.engine.processors import RowFilters


class CompiledPrograms:
  """The program builders and warm-up of an `Engine` (module docstring)."""

  def precompile(self, rows: Seq[int], max_len: int, filters: RowFilters = RowFilters(False),
                 eos_width: int = 4, threads: int | None = None) -> int:
    """Compiles, in parallel threads, the decode programs of batches of `rows` sequences (each count
    rounded to its row bucket) for every page bucket up to sequences of `max_len` positions (XLA compiles
    without the GIL: a many-core host compiles them at once instead of one per new bucket mid-run).
    filters / eos_width: those the batches will use (greedy, <= 4 EOS ids by default). Returns the
    number of programs compiled."""
    widths = {self._table_width(n) for n in range(1, max_len + self.page_size, self.page_size)}
    keys = [("decode", self._rows(r), w, eos_width, filters)
            for r in sorted(set(rows)) for w in sorted(widths)]
    return self._compile_all(keys, threads)

  def _decode_program(self, b: int, width: int, e: int, filters: RowFilters):
    """The compiled decode chunk for b rows, block tables `width` pages wide, e EOS ids a row."""
    def build():
      i32, f32 = self._spec(jnp.int32), self._spec(jnp.float32)
      state = {"pending": i32(b), "pos": i32(b), "budget": i32(b), "count": i32(b),
               "active": self._spec(jnp.bool_)(b), "temperature": f32(b), "top_k": i32(b),
               "top_p": f32(b), "key": self._spec(jnp.uint32)(b, 2), "eos": i32(b, e)}
      return device.decode_chunk.lower(
          self.params, self.pool, i32(b, width), state, self.lora, self._scale_spec(b), config=self.config,
          dtype=self.dtype, impl=self.impl, kernel=self.attention, filters=filters,
          num_steps=self.chunk_size, pool_sharding=self._pool_sharding).compile()
    key = self._program_key("decode", b, width, e, filters)
    program = _compiled(key, build)
    self.programs.add(key)
    return program

  def _prefill_program(self, b: int, width: int, n: int):
    """The compiled prefill of b rows of `width` tokens with block tables n pages wide."""
    def build():
      i32 = self._spec(jnp.int32)
      return device.prefill.lower(
          self.params, self.pool, i32(b, n), i32(b, width), i32(b, width), self._spec(jnp.bool_)(b, width),
          self.lora, self._scale_spec(b), config=self.config, dtype=self.dtype, impl=self.impl,
          pool_sharding=self._pool_sharding).compile()
    return _compiled(self._program_key("prefill", b, width, n), build)

  def _copy_program(self, c: int):
    """The compiled copy of c pages (`device.copy_pages`)."""
    i32 = self._spec(jnp.int32)(c)
    return _compiled(self._program_key("copy", c), lambda: device.copy_pages.lower(
        self.pool, i32, i32, num_layers=self.config.num_layers, pool_sharding=self._pool_sharding).compile())

  def _scale_spec(self, b: int):
    """The LoRA scale argument of a b-row call: the engine's scalar, or the shape of per-row weights."""
    if self.adapter_scales is None:
      return self.lora_scale
    return self._spec(jnp.float32)(b, len(self.adapter_scales))

  def serving_programs(self, max_len: int, eos_width: int | None = None) -> list[tuple]:
    """Every program `step` can meet while each sequence stays within `max_len` positions: ("decode", rows,
    table width, eos width, filters) for every row bucket up to max_rows, table width up to max_len and
    the three `RowFilters` (eos width: `_eos_width` of the engine's EOS ids, default); ("prefill", rows, block
    width, table width) for every block width up to min(prefill_chunk, max_len - 1) tokens and row count
    the prefill budget allows it; ("copy", pages) for copy-on-write of up to max_rows pages at once."""
    max_len = min(int(max_len), self._row_limit())
    e = eos_width or self._eos_width(0)
    rows = sorted({self._rows(r) for r in range(1, self.max_rows + 1)})
    ends = range(1, max_len + self.page_size, self.page_size)  # every page count up to max_len
    widths = sorted({self._table_width(min(n, max_len)) for n in ends})
    filters = (RowFilters(False), RowFilters(True, False), RowFilters(True, True))
    keys = [("decode", b, w, e, f) for f in filters for b in rows for w in widths]
    blocks = {}  # block width -> shortest longest-row length that picks it
    for longest in range(1, min(self.prefill_chunk, max_len - 1) + 1):
      blocks.setdefault(min(bucket(longest, minimum=16), self.prefill_chunk), longest)
    for width, shortest in sorted(blocks.items()):
      cap = min(self.max_rows, max(1, self.prefill_tokens // width))
      tables = ({self._table_width(self._row_limit())} if self.prefill_full_table else
                {self._table_width(min(n, max_len)) for n in range(shortest, max_len + self.page_size, self.page_size)})
      keys += [("prefill", b, width, n) for b in sorted({self._rows(r)
                                                         for r in range(1, cap + 1)}) for n in sorted(tables)]
    keys += [("copy", c) for c in sorted({device.row_bucket(r) for r in range(1, self.max_rows + 1)})]
    return keys

  def warm_up(self, max_len: int, eos_width: int | None = None, threads: int | None = None) -> int:
    """Compiles, in parallel threads, every program of `serving_programs(max_len, eos_width)` not compiled
    yet (a server then compiles nothing while it serves); returns how many it compiled."""
    return self._compile_all(self.serving_programs(max_len, eos_width), threads)

  def _compile_all(self, keys: list[tuple], threads: int | None) -> int:
    """Compiles the programs of `keys` (as `serving_programs`) not compiled yet, in parallel threads (XLA
    compiles without the GIL); returns how many."""
    build = {"decode": self._decode_program, "prefill": self._prefill_program, "copy": self._copy_program}
    with _PROGRAMS_LOCK:
      todo = [k for k in dict.fromkeys(keys) if self._program_key(*k) not in _PROGRAMS]
    workers = threads or max(1, min(len(todo), (os.cpu_count() or 2) // 2))
    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
      list(pool.map(lambda k: build[k[0]](*k[1:]), todo))
    return len(todo)

  def _program_key(self, kind: str, *shape) -> tuple:
    """The `_PROGRAMS` key of a program of `serving_programs`' form (kind, *shape): decode chunks by
    (signature, rows, table width, eos width, filters), the others by (signature, kind, *shape)."""
    return (self._signature, *shape) if kind == "decode" else (self._signature, kind, *shape)

  def _spec(self, dtype):
    """shape -> the ShapeDtypeStruct of a host input of that shape (replicated over the mesh under tensor
    parallelism), for lowering a program ahead of its first call."""
    on = None if self.mesh is None else tp.replicated(self.mesh)
    return lambda *shape: jax.ShapeDtypeStruct(shape, dtype, sharding=on)


# Compiled programs: decode chunks by (engine signature: statics and argument shapes, rows, table width, eos
# width, filters), prefills by (signature, "prefill", rows, block width, table width), page copies by
# (signature, "copy", pages); shared by engines of the same model and pool shape (a new engine does not
# compile them again).
# Least recently used first out: an RL run alternates sampled rollouts and greedy evaluations, whose
# programs together outnumbered a first-in-first-out bound of 64 and were compiled again after every
# evaluation (Search-R1 on an H200, 2026-11-27).
_PROGRAMS: collections.OrderedDict = collections.OrderedDict()
_PROGRAMS_LOCK = threading.Lock()
MAX_PROGRAMS = 512  # compiled programs kept (an executable is host code, not device memory)


def _compiled(key, build):
  """The program of `key` from `_PROGRAMS` (now the most recently used), else build() stored under it."""
  with _PROGRAMS_LOCK:  # engines of several devices run in threads (`sampling.replicas`)
    program = _PROGRAMS.get(key)
    if program is not None:
      _PROGRAMS.move_to_end(key)
      return program
  program = build()
  with _PROGRAMS_LOCK:
    _PROGRAMS[key] = program
    while len(_PROGRAMS) > MAX_PROGRAMS:  # least recently used first: a long process stays bounded
      _PROGRAMS.popitem(last=False)
  return program


def clear_programs() -> int:
  """Drops every compiled program (engines compile them again on next use); returns how many it dropped."""
  with _PROGRAMS_LOCK:
    n = len(_PROGRAMS)
    _PROGRAMS.clear()
  return n


def signature_shapes(tree) -> tuple:
  """(treedef, ((shape, dtype name) of each leaf)): the part of a program key an argument tree gives."""
  leaves, treedef = jax.tree.flatten(tree)
  return treedef, tuple((tuple(x.shape), jnp.dtype(x.dtype).name) for x in leaves)
