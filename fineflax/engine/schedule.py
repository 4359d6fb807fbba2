"""Which sequences hold rows and pages: admission, preemption, and a cancelled leader's hand-over.

`Scheduler` is a mixin of `fineflax.engine.engine.Engine`; it reads the engine's `pages` (PageAllocator),
`live` (admission order, oldest first), `waiting` (groups), `max_rows`, `chunk_size`, `page_size`,
`admission`, `watermark_pages` and `stats`.

Admission (each step, first come first served, a group of n samples as one unit): a group enters while at
most `max_rows` rows are live and the free pages cover what admission counts for every live row and the
group (`_need`), plus `watermark_pages` under the watermark rule:
  "watermark" (default, as vLLM): the pages a row takes up to the end of its next decode chunk
      (`_step_need`: prompt, or prompt + tokens for a recomputed row, then min(budget, chunk_size));
  "reserve": its prompt + whole reserve (`_outstanding`); no row is ever preempted, but a long reserve
      keeps rows out that would have ended early.
Preemption (`_make_room`, before each prefill or decode call): while the pages the call's rows take are
not free, the newest live row with work (prefilling, or ready with a budget; a held row with no budget
keeps its pages) is preempted (`_preempt`): its pages freed, it waits at the head of the queue and, when it
enters again, prefills prompt + the tokens it had (recompute, as vLLM's). Its tokens, budget and the
key's counter stay: token t of a sequence is drawn with fold_in(key, t), so greedy and sampled rows
decode the same tokens as without preemption. The oldest row is never preempted for a newer one, so it
always progresses. Counters: stats["preemptions"] (rows), stats["recomputed_tokens"] (cache positions
dropped).
"""
from __future__ import annotations

from fineflax.engine.pages import pages_for
from fineflax.engine.sequence import Sequence

ADMISSIONS = ("watermark", "reserve")


class Scheduler:
  """Admission and preemption of an `Engine` (module docstring)."""

  def _outstanding(self, seq: Sequence) -> int:
    """Pages `seq` may still take from the free list to reach its max_len (copies on write included).
    A group shares its prompt's full pages: the followers never take those; whoever writes into the
    shared partial page first takes a copy of it (the last holder writes the original)."""
    size, table = pages_for(seq.max_len, self.page_size), self.pages.tables.get(seq.id)
    shared_full = (len(seq.prompt) - 1) // self.page_size
    partial = (len(seq.prompt) - 1) % self.page_size != 0
    if seq.leader is not None and seq.status in ("waiting", "fork"):
      return size - shared_full
    if table is None:  # waiting
      return size + int(partial and bool(seq.followers))
    forking = partial and any(f.status in ("waiting", "fork") for f in seq.followers)
    shared_tail = bool(table) and seq.cache_len % self.page_size != 0 and self.pages.refcount[table[-1]] > 1
    return max(size - len(table), 0) + int(shared_tail or forking)

  def _step_need(self, seq: Sequence) -> int:
    """Pages `seq` takes from the free list until the end of its next decode chunk (its prefill first:
    positions up to len(full) - 1 + min(budget, chunk_size)); a group's follower does not count the
    prompt's full pages it will share (a copy of the shared partial page counts). 0 for a row with no
    work (finished, or held with no budget)."""
    k = max(min(seq.budget, self.chunk_size), 0)
    if seq.status == "ready":
      return self.pages.pages_to_grow(seq.id, seq.cache_len + k) if k > 0 else 0
    if seq.status not in ("waiting", "prefill", "fork"):
      return 0
    table = self.pages.tables.get(seq.id)
    have = (len(seq.prompt) - 1) // self.page_size if seq.leader is not None else len(table or ())
    return max(pages_for(len(seq.full) - 1 + k, self.page_size) - have, 0)

  def _need(self, seq: Sequence) -> int:
    """The pages admission counts for `seq`: "reserve", its prompt + whole reserve (`_outstanding`);
    "watermark", its next chunk's (`_step_need`)."""
    return self._outstanding(seq) if self.admission == "reserve" else self._step_need(seq)

  def _admit(self) -> None:
    """Waiting groups enter, first come first served, while rows are free and the pages every live row
    and the group need (`_need`), plus `watermark_pages` with the watermark's rule, are free."""
    if not self.waiting:
      return
    committed = sum(self._need(s) for s in self.live)
    margin = self.watermark_pages if self.admission == "watermark" else 0
    while self.waiting:
      group = self.waiting[0]
      if len(self.live) + len(group) > self.max_rows:
        return
      need = sum(self._need(s) for s in group)
      if committed + need + margin > self.pages.num_free:
        if self.live:
          return
        if self.admission == "reserve":
          raise RuntimeError(f"a request needs {need} pages; the pool has {self.pages.num_free} free: raise "
                             "num_pages")
        # an empty engine takes the group: its first row fits the pool (submit checks), the others
        # are preempted until they fit
      committed += need
      self.waiting.pop(0)
      for s in group:
        if s.status == "cancelled":
          continue
        if s.leader is None:
          self.pages.new(s.id)
        s.status = "fork" if s.leader is not None else "prefill"
        self.live.append(s)

  def _make_room(self, plan: list[tuple[Sequence, int]]) -> list[tuple[Sequence, int]]:
    """Preempts the newest live rows with work (`_preempt`) until the pages the rows of `plan` take to grow
    to their lengths (sequence, length) are free; returns the plan's rows still live. A row with no work
    (held, no budget) is never preempted: its pages are its owner's. With no row left to preempt, the
    plan is empty: the step does nothing and `run` names the held rows."""
    while True:
      plan = [(s, end) for s, end in plan if s.status != "waiting"]
      need = sum(self.pages.pages_to_grow(s.id, end) for s, end in plan)
      if need <= self.pages.num_free:
        return plan
      planned = {s.id for s, _ in plan}
      victim = next((s for s in reversed(self.live) if self._preemptible(s)
                     and (s.id in planned or self.pages.tables.get(s.id))), None)
      if victim is None:
        return []
      self._preempt(victim)

  def _preemptible(self, seq: Sequence) -> bool:
    """A live row with work: prefilling, or ready with a budget (a group's follower waiting for its
    leader's prompt holds no pages: it goes with its leader)."""
    return seq.status == "prefill" or (seq.status == "ready" and seq.budget > 0)

  def _preempt(self, seq: Sequence) -> None:
    """Frees `seq`'s pages and queues it ahead of new work to recompute its prompt and tokens (a prefill of
    full[:-1]); its followers that wait for its prompt go with it, those that share its pages already
    keep them. Tokens, budget and the key's counter are kept: the row continues where it stopped (token t
    is drawn with fold_in(key, t) whatever the row's history)."""
    group = [seq] + [f for f in seq.followers if f.status == "fork"]
    for f in seq.followers:
      if f.status != "fork":
        f.leader = None
    if seq.leader is not None:
      seq.leader.followers.remove(seq)
    seq.leader, seq.followers = None, group[1:]
    self.stats["preemptions"] += len(group)
    self.stats["recomputed_tokens"] += seq.cache_len
    if seq.id in self.pages.tables:
      self.pages.release(seq.id)
    for s in group:
      self.live.remove(s)
      s.status, s.cache_len = "waiting", 0
      s.preemptions += 1
    self.waiting.insert(0, group)

  def _hand_over(self, seq: Sequence) -> None:
    """Before a live leader leaves: its first follower still waiting for the prompt becomes the group's
    leader, holding the pages prefilled so far (they hold the same prompt's KV) and prefilling the rest;
    the other waiting followers wait for it. The group's pages stay what admission counted (before, each
    waiting follower prefilled the whole prompt itself into pages no one had counted: OutOfPages)."""
    waiting = [f for f in seq.followers if f.status == "fork"]
    if not waiting:
      return
    heir = waiting[0]
    self.pages.fork(seq.id, heir.id, seq.cache_len)
    heir.leader, heir.followers, heir.status, heir.cache_len = None, waiting[1:], "prefill", seq.cache_len
    for f in waiting[1:]:
      f.leader = heir
    seq.followers = [f for f in seq.followers if f not in waiting]
