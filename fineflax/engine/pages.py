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

Prefix cache (as vLLM's automatic prefix caching / SGLang's radix cache):
    a.cache_prefix(7, prompt[:-1], salt)   # 7's full pages of these tokens stay after 7 is released
    pages = a.match_prefix(prompt2, salt)  # the cached full pages of prompt2's longest cached prefix
    a.new(9, pages)                        # sequence 9 starts with them (length len(pages) x page_size)
A cached page is a node of a trie keyed by (parent node, its page_size tokens) from a root per `salt` (what
else the KV depends on: the LoRA adapter), so a key names all the tokens before it, exactly (no hash
collisions). The cache holds one reference to each cached page (counted in refcount). A sequence's cached
pages are a chain from the root of its own table's first pages (`cache_prefix` stops where a block is cached
by another page), so whoever holds a cached page holds its ancestors: a page only the cache holds has only
such pages below it, and all of them can be evicted, leaves first. `num_free` counts the free list plus
the pages only the cache holds; taking a page when the free list is empty evicts the least recently used of
those that no cached page continues. A cached page is full, so no sequence writes it (a sequence cut back
into it copies it on write, as any shared page).
"""
from __future__ import annotations

import collections

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
    # prefix cache: key (parent node id or ("root", salt), tokens) -> node id; node id -> [page, key,
    # children]; page -> node id; node ids least recently used first; count of evictable nodes
    self._trie: dict[tuple, int] = {}
    self._nodes: dict[int, list] = {}
    self._page_node: dict[int, int] = {}
    self._lru: collections.OrderedDict = collections.OrderedDict()
    self._evictable = 0
    self._next_node = 0
    self.evicted = 0  # cached pages evicted so far

  # ------------------------------------------------------------------------------------------------
  @property
  def num_free(self) -> int:
    """Pages a sequence can take: the free list plus the cached pages that can be evicted."""
    return len(self._free) + self._evictable

  @property
  def num_used(self) -> int:
    """Pages referenced by at least one sequence or the prefix cache (shared pages counted once)."""
    return self.num_pages - 1 - len(self._free)

  @property
  def num_cached(self) -> int:
    """Pages held by the prefix cache (some of them also by sequences)."""
    return len(self._nodes)

  def new(self, seq: int, prefix: list[int] = ()) -> None:
    """Registers sequence `seq` with length 0, or starting with the cached full pages `prefix` (from
    `match_prefix`; length len(prefix) x page_size)."""
    if seq in self.tables:
      raise ValueError(f"sequence {seq} already has a block table")
    for page in prefix:
      if page not in self._page_node:
        raise ValueError(f"new(seq={seq}): page {page} is not in the prefix cache")
      self._ref(page, +1)
    self.tables[seq], self.lengths[seq] = list(prefix), len(prefix) * self.page_size

  def match_prefix(self, tokens, salt=None) -> list[int]:
    """The cached pages of the longest cached prefix of `tokens` made of full pages (those of `salt`),
    marked recently used."""
    pages, parent = [], ("root", salt)
    for start in range(0, len(tokens) - self.page_size + 1, self.page_size):
      node = self._trie.get((parent, tuple(int(t) for t in tokens[start:start + self.page_size])))
      if node is None:
        break
      self._lru.move_to_end(node)
      pages.append(self._nodes[node][0])
      parent = node
    return pages

  def cache_prefix(self, seq: int, tokens, salt=None) -> int:
    """Puts `seq`'s full pages holding `tokens` (its positions 0 .. len(tokens) - 1) in the prefix cache
    (blocks already cached, by this or another page, are only marked recently used). Returns the pages
    added."""
    table, added, parent = self.tables[seq], 0, ("root", salt)
    full = min(len(tokens), self.lengths[seq]) // self.page_size
    for i in range(full):
      key = (parent, tuple(int(t) for t in tokens[i * self.page_size:(i + 1) * self.page_size]))
      node, page = self._trie.get(key), table[i]
      if node is not None and self._nodes[node][0] != page:
        break  # cached by another page: this table's chain ends here (module docstring)
      if node is None:
        if page in self._page_node:  # cached under another key: cannot be (a page holds one block)
          raise AssertionError(f"page {page} is cached twice")
        node, self._next_node = self._next_node, self._next_node + 1
        if not isinstance(parent, tuple):
          self._nodes[parent][2] += 1
        self._nodes[node] = [page, key, 0]
        self._trie[key], self._page_node[page] = node, node
        self.refcount[page] += 1  # the cache's reference (not evictable while the sequence holds it)
        added += 1
      self._lru[node] = None
      self._lru.move_to_end(node)
      parent = node
    return added

  def grow(self, seq: int, length: int) -> list[tuple[int, int]]:
    """Pages for positions 0 .. length - 1, those at positions >= the current length owned by `seq`
    alone. Returns the (src, dst) page copies the caller must make on the device before writing (copy on
    write of a shared page). Raises OutOfPages (nothing changed) when the free list is too short."""
    old, table = self.lengths[seq], self.tables[seq]
    if length < old:
      raise ValueError(f"grow(seq={seq}, length={length}) below its length {old}; use truncate")
    shared_tail = old % self.page_size != 0 and self.refcount[table[-1]] > 1 and length > old
    need = pages_for(length, self.page_size) - len(table) + int(shared_tail)
    if need > self.num_free:
      raise OutOfPages(f"sequence {seq} needs {need} pages to reach {length} tokens; {self.num_free} free "
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
      self._ref(page, +1)
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
    for node, (page, key, children) in self._nodes.items():
      counts[page] += 1  # the cache's reference
      assert self._trie[key] == node and self._page_node[page] == node and node in self._lru
      assert isinstance(key[0], tuple) or key[0] in self._nodes, f"cached node {node} lost its parent"
      assert children == sum(1 for k in self._nodes.values() if k[1][0] == node), f"node {node}'s children"
    assert len(self._trie) == len(self._nodes) == len(self._page_node) == len(self._lru)
    assert self._evictable == sum(map(self._is_evictable, self._nodes)), "evictable count"
    for page, key, _ in self._nodes.values():  # whoever holds a cached page holds its cached ancestors
      if not isinstance(key[0], tuple):
        assert self.refcount[self._nodes[key[0]][0]] >= self.refcount[page], f"page {page} outlives its parent"
    assert counts[TRASH_PAGE] == 0 and self.refcount[TRASH_PAGE] == 0, "the trash page was handed out"
    assert (counts == self.refcount).all(), "reference counts differ from the block tables"
    free = np.zeros(self.num_pages, bool)
    free[self._free] = True
    assert len(set(self._free)) == len(self._free), "a page is on the free list twice"
    assert not (free & (counts > 0)).any(), "a page is both free and owned"
    assert (free | (counts > 0))[1:].all(), "a page leaked: neither free nor owned"

  # ------------------------------------------------------------------------------------------------
  def _take(self) -> int:
    if not self._free:
      self._evict_one()
    page = self._free.pop()
    self.refcount[page] = 1
    return page

  def _unref(self, page: int) -> None:
    self._ref(page, -1)
    if self.refcount[page] == 0:
      self._free.append(page)

  def _ref(self, page: int, delta: int) -> None:
    node = self._page_node.get(page)
    if node is None:
      self.refcount[page] += delta
    else:
      self._count_evictable(node, lambda: self.refcount.__setitem__(page, self.refcount[page] + delta))

  def _is_evictable(self, node: int) -> bool:
    """Only the cache holds the node's page (it and its cached descendants can go)."""
    return bool(self.refcount[self._nodes[node][0]] == 1)

  def _count_evictable(self, node: int, change) -> None:
    """Runs change() (of node's refcount), keeping the evictable count."""
    before = self._is_evictable(node)
    change()
    self._evictable += self._is_evictable(node) - before

  def _evict_one(self) -> None:
    """Drops the least recently used cached page that only the cache holds and no cached page continues
    (its page goes to the free list)."""
    node = next((n for n in self._lru if self._nodes[n][2] == 0 and self._is_evictable(n)), None)
    if node is None:
      raise OutOfPages("no free page and no evictable cached page")
    page, key, _ = self._nodes[node]
    self._evictable -= 1
    del self._nodes[node], self._trie[key], self._page_node[page], self._lru[node]
    self.evicted += 1
    if not isinstance(key[0], tuple):
      self._nodes[key[0]][2] -= 1
    self.refcount[page] -= 1
    if self.refcount[page] == 0:
      self._free.append(page)
