"""The host side of the paged KV cache: which pages of the pool each sequence owns.

    a = PageAllocator(num_pages=1024, page_size=16)
    a.new(7)                        # sequence 7, no pages yet
    copies = a.grow(7, 40)          # pages for 40 tokens (positions 0..39); [] copies
    a.fork(7, 8, 40)                # sequence 8 shares 7's pages holding positions 0..39
    copies = a.grow(8, 41)          # 8 writes position 40 into the shared partial page 2: copy on write
                                    #   -> [(src, dst)]: the caller copies page src to dst on the device
    a.truncate(7, 20); a.release(8) # pages past position 19 / all of 8's pages back (when unshared)

Facts kept (checked by `check`): page 0 is the trash page (never handed out); every other page is either
free or referenced by refcount[page] >= 1 block-table entries of live sequences, and refcount equals the
number of those entries; a sequence's table holds exactly ceil(length / page_size) distinct pages.
A sequence only writes positions >= its length after `grow`, and `grow` makes the pages it will write
exclusively its own (copy on write of a shared, partially filled page), so no page is written by two rows.
"""
from __future__ import annotations

import numpy as np

TRASH_PAGE = 0


class OutOfPages(RuntimeError):
  """The pool has fewer free pages than a request needs."""


def pages_for(length: int, page_size: int) -> int:
  """ceil(length / page_size): pages holding positions 0 .. length - 1."""
  return -(-int(length) // page_size)


class PageAllocator:
  """Free list, per-sequence block tables and reference counts over pages 1 .. num_pages - 1."""

  def __init__(self, num_pages: int, page_size: int):
    if num_pages < 2 or page_size < 1:
      raise ValueError(f"PageAllocator(num_pages={num_pages}, page_size={page_size}): need num_pages >= 2 "
                       "(page 0 is the trash page) and page_size >= 1")
    self.num_pages, self.page_size = int(num_pages), int(page_size)
    self.refcount = np.zeros(self.num_pages, np.int32)
    self._free = list(range(self.num_pages - 1, TRASH_PAGE, -1))  # a stack: low ids handed out first
    self.tables: dict[int, list[int]] = {}
    self.lengths: dict[int, int] = {}

  # ------------------------------------------------------------------------------------------------
  @property
  def num_free(self) -> int:
    return len(self._free)

  @property
  def num_used(self) -> int:
    """Pages referenced by at least one sequence (shared pages counted once)."""
    return self.num_pages - 1 - len(self._free)

  def new(self, seq: int) -> None:
    """Registers sequence `seq` with no pages and length 0."""
    if seq in self.tables:
      raise ValueError(f"sequence {seq} already has a block table")
    self.tables[seq], self.lengths[seq] = [], 0

  def grow(self, seq: int, length: int) -> list[tuple[int, int]]:
    """Pages for positions 0 .. length - 1, those at positions >= the current length owned by `seq`
    alone. Returns the (src, dst) page copies the caller must make on the device before writing (copy on
    write of a shared page). Raises OutOfPages (nothing changed) when the free list is too short."""
    old, table = self.lengths[seq], self.tables[seq]
    if length < old:
      raise ValueError(f"grow(seq={seq}, length={length}) below its length {old}; use truncate")
    shared_tail = old % self.page_size != 0 and self.refcount[table[-1]] > 1 and length > old
    need = pages_for(length, self.page_size) - len(table) + int(shared_tail)
    if need > len(self._free):
      raise OutOfPages(f"sequence {seq} needs {need} pages to reach {length} tokens; {len(self._free)} free "
                       f"of {self.num_pages - 1}")
    copies = []
    if shared_tail:
      src, dst = table[-1], self._take()
      self._unref(src)
      table[-1] = dst
      copies.append((src, dst))
    while len(table) < pages_for(length, self.page_size):
      table.append(self._take())
    self.lengths[seq] = int(length)
    return copies

  def fork(self, src: int, dst: int, length: int) -> None:
    """New sequence `dst` sharing `src`'s pages that hold positions 0 .. length - 1 (length <= src's)."""
    if length > self.lengths[src]:
      raise ValueError(f"fork({src} -> {dst}, length={length}): sequence {src} holds {self.lengths[src]}")
    self.new(dst)
    shared = self.tables[src][:pages_for(length, self.page_size)]
    for page in shared:
      self.refcount[page] += 1
    self.tables[dst], self.lengths[dst] = list(shared), int(length)

  def truncate(self, seq: int, length: int) -> None:
    """Keeps positions 0 .. length - 1 of `seq`; pages past them are released."""
    if length > self.lengths[seq]:
      raise ValueError(f"truncate(seq={seq}, length={length}) beyond its length {self.lengths[seq]}")
    table = self.tables[seq]
    keep = pages_for(length, self.page_size)
    for page in table[keep:]:
      self._unref(page)
    del table[keep:]
    self.lengths[seq] = int(length)

  def release(self, seq: int) -> None:
    """Drops sequence `seq`; each of its pages returns to the free list when no other sequence holds it."""
    self.truncate(seq, 0)
    del self.tables[seq], self.lengths[seq]

  def pages_to_grow(self, seq: int, length: int) -> int:
    """Pages `grow(seq, length)` would take from the free list."""
    old, table = self.lengths[seq], self.tables[seq]
    shared_tail = old % self.page_size != 0 and self.refcount[table[-1]] > 1 and length > old
    return max(pages_for(length, self.page_size) - len(table), 0) + int(shared_tail)

  def block_table(self, seqs, width: int) -> np.ndarray:
    """int32 [len(seqs), width]: each sequence's pages in order, then the trash page."""
    out = np.full((len(seqs), width), TRASH_PAGE, np.int32)
    for r, seq in enumerate(seqs):
      table = self.tables[seq]
      if len(table) > width:
        raise ValueError(f"sequence {seq} has {len(table)} pages; the block table is {width} wide")
      out[r, :len(table)] = table
    return out

  def check(self) -> None:
    """Asserts the facts of the module docstring (tests, debugging)."""
    counts = np.zeros(self.num_pages, np.int64)
    for seq, table in self.tables.items():
      assert len(table) == pages_for(self.lengths[seq], self.page_size), (seq, table, self.lengths[seq])
      assert len(set(table)) == len(table), f"sequence {seq} holds a page twice: {table}"
      for page in table:
        counts[page] += 1
    assert counts[TRASH_PAGE] == 0 and self.refcount[TRASH_PAGE] == 0, "the trash page was handed out"
    assert (counts == self.refcount).all(), "reference counts differ from the block tables"
    free = np.zeros(self.num_pages, bool)
    free[self._free] = True
    assert len(set(self._free)) == len(self._free), "a page is on the free list twice"
    assert not (free & (counts > 0)).any(), "a page is both free and owned"
    assert (free | (counts > 0))[1:].all(), "a page leaked: neither free nor owned"

  # ------------------------------------------------------------------------------------------------
  def _take(self) -> int:
    page = self._free.pop()
    self.refcount[page] = 1
    return page

  def _unref(self, page: int) -> None:
    self.refcount[page] -= 1
    if self.refcount[page] == 0:
      self._free.append(page)
