"""The page allocator under random admit / append / fork / truncate / finish events: no page leaked, none
owned twice, shared pages freed only with their last sequence, and every sequence reads back exactly the
tokens it wrote (copy on write of shared partial pages)."""
import numpy as np
import pytest

from fineflax.engine.pages import OutOfPages, PageAllocator, pages_for

pytestmark = pytest.mark.fast

S = 4


class Store:
  """A shadow pool: page -> per-offset labels; writes check that the writer owns the page alone."""

  def __init__(self, alloc):
    self.alloc, self.pages = alloc, {}

  def apply(self, copies):
    for src, dst in copies:
      self.pages[dst] = list(self.pages.get(src, [None] * S))

  def write(self, seq, start, labels):
    table = self.alloc.tables[seq]
    for i, label in enumerate(labels):
      pos = start + i
      page = table[pos // S]
      assert self.alloc.refcount[page] == 1, f"sequence {seq} writes shared page {page}"
      self.pages.setdefault(page, [None] * S)[pos % S] = label

  def read(self, seq):
    table, n = self.alloc.tables[seq], self.alloc.lengths[seq]
    return [self.pages[table[p // S]][p % S] for p in range(n)]


def _truncate_one(alloc, expect, rng, live):
  """A random live sequence cut back to a random length."""
  seq = int(rng.choice(live))
  length = int(rng.integers(0, alloc.lengths[seq] + 1))
  alloc.truncate(seq, length)
  expect[seq] = expect[seq][:length]


def test_random_events_keep_every_page_accounted_for():
  rng = np.random.default_rng(0)
  alloc = PageAllocator(num_pages=40, page_size=S)
  store, expect = Store(alloc), {}  # expect: seq -> the labels it must read back
  next_id, shared_frees, counts = 0, 0, {}
  for event in range(1000):
    kind = rng.choice(["admit", "append", "fork", "truncate", "finish"], p=[0.2, 0.35, 0.15, 0.1, 0.2])
    live = sorted(expect)
    if kind == "admit" or not live:
      seq, n = next_id, int(rng.integers(1, 12))
      next_id += 1
      alloc.new(seq)
      try:
        store.apply(alloc.grow(seq, n))
      except OutOfPages:
        alloc.release(seq)
        continue
      labels = [(seq, i) for i in range(n)]
      store.write(seq, 0, labels)
      expect[seq] = labels
    elif kind == "append":
      seq = int(rng.choice(live))
      old, k = alloc.lengths[seq], int(rng.integers(1, 7))
      before = (alloc.num_free, list(alloc.tables[seq]))
      try:
        store.apply(alloc.grow(seq, old + k))
      except OutOfPages:
        assert (alloc.num_free, alloc.tables[seq]) == before  # nothing changed
        continue
      labels = [(seq, old + i, event) for i in range(k)]
      store.write(seq, old, labels)
      expect[seq] = expect[seq] + labels
    elif kind == "fork":
      src = int(rng.choice(live))
      length = int(rng.integers(0, alloc.lengths[src] + 1))
      seq = next_id
      next_id += 1
      alloc.fork(src, seq, length)
      expect[seq] = expect[src][:length]
    elif kind == "truncate":
      _truncate_one(alloc, expect, rng, live)
    else:
      seq = int(rng.choice(live))
      shared = [p for p in alloc.tables[seq] if alloc.refcount[p] > 1]
      alloc.release(seq)
      del expect[seq]
      free = set(alloc._free)
      assert not free & set(shared), "a shared page was freed while another sequence holds it"
      shared_frees += bool(shared)
    counts[kind] = counts.get(kind, 0) + 1
    alloc.check()
    for seq, labels in expect.items():
      assert store.read(seq) == labels, f"sequence {seq} reads other tokens than it wrote (event {event})"
  assert min(counts.values()) > 50 and shared_frees > 10, (counts, shared_frees)
  for seq in list(expect):
    alloc.release(seq)
  alloc.check()
  assert alloc.num_free == alloc.num_pages - 1 and alloc.num_used == 0


def test_fork_shares_full_pages_and_copies_the_partial_one_on_write():
  alloc = PageAllocator(num_pages=16, page_size=S)
  alloc.new(0)
  alloc.grow(0, 10)  # pages for positions 0..9: 3 pages, the last holds 2
  for seq in (1, 2, 3):
    alloc.fork(0, seq, 10)
  assert alloc.num_used == 3
  copies = [alloc.grow(seq, 11) for seq in (0, 1, 2, 3)]
  assert [len(c) for c in copies] == [1, 1, 1, 0]  # the last holder writes the original page
  assert all(alloc.tables[s][:2] == alloc.tables[0][:2] for s in (1, 2, 3))
  assert alloc.num_used == 2 + 4
  assert pages_for(10, S) == 3 and pages_for(0, S) == 0


def test_errors_name_the_problem():
  alloc = PageAllocator(num_pages=3, page_size=S)
  alloc.new(0)
  with pytest.raises(OutOfPages, match="needs 3 pages"):
    alloc.grow(0, 9)
  with pytest.raises(ValueError, match="already has a block table"):
    alloc.new(0)
  with pytest.raises(ValueError, match="num_pages >= 2"):
    PageAllocator(num_pages=1, page_size=S)


def test_prefix_cache_under_random_events_shares_evicts_and_keeps_contents():
  """Prompts from a few shared prefixes: a new sequence starts with the cached pages of its longest cached
  full-page prefix (which must hold exactly its tokens), finished sequences' prompt pages stay cached,
  eviction makes room; no page leaked or owned twice; every sequence reads back its own tokens."""
  rng = np.random.default_rng(1)
  alloc = PageAllocator(num_pages=48, page_size=S)
  store, expect = Store(alloc), {}  # labels: the token at each position (the KV is a function of them)
  prefixes = [[int(t) for t in rng.integers(0, 50, size=n)] for n in (3, 9, 14, 21)]
  next_id, counts, hits, evictions = 0, {}, 0, 0
  for event in range(1000):
    kind = rng.choice(["admit", "append", "truncate", "finish"], p=[0.35, 0.25, 0.1, 0.3])
    live = sorted(expect)
    if kind == "admit" or not live:
      kind = "admit"
      tokens = list(prefixes[rng.integers(len(prefixes))]) + [int(t) for t in rng.integers(0, 50, size=rng.integers(0, 6))]
      salt = int(rng.integers(2))  # e.g. the adapter: a prefix of another salt is not shared
      seq, cached_before = next_id, alloc.num_cached
      next_id += 1
      pages = alloc.match_prefix(tokens, salt)
      alloc.new(seq, pages)
      hits += bool(pages)
      assert store.read(seq) == tokens[:len(pages) * S]  # the cached pages hold these very tokens
      free_before = len(alloc._free)
      try:
        store.apply(alloc.grow(seq, len(tokens)))
      except OutOfPages:
        alloc.release(seq)
        continue
      evictions += alloc.num_cached < cached_before
      assert alloc.num_cached < cached_before or len(alloc._free) <= free_before
      store.write(seq, len(pages) * S, tokens[len(pages) * S:])
      alloc.cache_prefix(seq, tokens, salt)
      expect[seq] = tokens
    elif kind == "append":
      seq = int(rng.choice(live))
      old, k = alloc.lengths[seq], int(rng.integers(1, 7))
      try:
        store.apply(alloc.grow(seq, old + k))
      except OutOfPages:
        continue
      new = [int(t) for t in rng.integers(50, 99, size=k)]
      store.write(seq, old, new)
      expect[seq] = expect[seq] + new
    elif kind == "truncate":
      _truncate_one(alloc, expect, rng, live)
    else:
      seq = int(rng.choice(live))
      alloc.release(seq)
      del expect[seq]
    counts[kind] = counts.get(kind, 0) + 1
    alloc.check()
    for seq, labels in expect.items():
      assert store.read(seq) == labels, f"sequence {seq} reads other tokens than it wrote (event {event})"
  assert min(counts.values()) > 50 and hits > 100 and evictions > 10, (counts, hits, evictions)
  for seq in list(expect):
    alloc.release(seq)
  alloc.check()
  assert alloc.num_free == alloc.num_pages - 1  # all free or evictable
  while alloc.num_cached:
    alloc._evict_one()
  alloc.check()
  assert len(alloc._free) == alloc.num_pages - 1 and alloc.num_used == 0
