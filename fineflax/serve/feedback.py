"""The reward log: every served answer and every reward given to it, in one SQLite file (WAL).

Schema (read by the log -> SFT exporter; columns may be added, never renamed):

  responses(id TEXT PRIMARY KEY, created REAL, variant TEXT, request_json TEXT, messages_json TEXT,
            answer TEXT, settings_json TEXT, choice INTEGER, prompt_tokens INTEGER,
            completion_tokens INTEGER, finish_reason TEXT,
            question TEXT, category TEXT, passages_json TEXT, input_json TEXT, trace TEXT)
  feedback(id INTEGER PRIMARY KEY, response_id TEXT, reward REAL, comment TEXT, created REAL)

One `responses` row per choice: choice 0 has the response's id ("chatcmpl-..."), choice i > 0 has
"<id>/<i>". `created` is Unix time; request_json is the request body as received, messages_json its
messages, settings_json the sampling settings used ({temperature, top_p, max_tokens, stop, seed, n}),
variant the model, adapter or RAG variant name that answered. The RAG columns (NULL for plain chat):
question (the last user message), category (the request's or the classifier's; NULL when none),
passages_json (the retrieved passages in order, [{id, title, text}]), input_json (the messages the
generator answered from, context included; an agentic answer's: the RAG prompt over every passage its
searches returned) and trace (an agentic answer's turns and inserted passages). Logs written before
these columns get them added (NULL) when opened.

Durability: journal_mode=WAL with synchronous=FULL, so every commit is fsynced to the WAL before the call
returns: a response or reward that was acknowledged survives SIGKILL (and power loss); one
`add_responses` call is one transaction, so a record killed mid-write is all there or absent.

Rewards: `add_feedback` takes finite numbers in `reward_range` [lo, hi] only (ValueError otherwise). A log
written before that rule (or by another tool) may hold other values; the statistics read it as
  reward not a finite number (NULL, NaN, +-inf, text): skipped;  a finite reward outside [lo, hi]: clipped,
and the first read says how many of each, once, on the `fineflax.serve` logger. The rows stay as they are.
"""
from __future__ import annotations

import json
import logging
import math
import sqlite3
import sys
import threading
import time

from fineflax.stats import t_interval

SCHEMA = """
CREATE TABLE IF NOT EXISTS responses(id TEXT PRIMARY KEY, created REAL, variant TEXT, request_json TEXT,
  messages_json TEXT, answer TEXT, settings_json TEXT, choice INTEGER, prompt_tokens INTEGER,
  completion_tokens INTEGER, finish_reason TEXT);
CREATE TABLE IF NOT EXISTS feedback(id INTEGER PRIMARY KEY, response_id TEXT, reward REAL, comment TEXT,
  created REAL);
CREATE INDEX IF NOT EXISTS feedback_response ON feedback(response_id);
"""
RAG_COLUMNS = ("question", "category", "passages_json", "input_json", "trace")  # added to old logs


REWARD_RANGE = (-1.0, 1.0)
BOUND_LIMIT = 1e9  # |lo|, |hi| at most this: sums of squares of many rewards stay finite

log = logging.getLogger("fineflax.serve")


class UnknownResponse(KeyError):
  """Feedback for an id that is not in the log."""


def ci95(n: int, total: float, total_sq: float) -> tuple[float | None, float | None, float | None]:
  """(mean, low, high): the Student t interval of the mean reward from its count and sums
  (`fineflax.stats.t_interval`); None for n = 0 (all three) or n = 1 (the bounds)."""
  if n == 0:
    return None, None, None
  mean, low, high = t_interval(n=n, total=total, total_sq=total_sq)
  return (mean, None, None) if n == 1 else (mean, low, high)


class FeedbackLog:
  """Thread-safe appends and reads over one SQLite connection (see module docstring)."""

  def __init__(self, path: str, synchronous: str = "FULL", reward_range: tuple[float, float] = REWARD_RANGE):
    if synchronous.upper() not in ("FULL", "EXTRA", "NORMAL"):
      raise ValueError(f"synchronous={synchronous!r}: choose FULL, EXTRA or NORMAL")
    lo, hi = (float(x) for x in reward_range)
    if not (math.isfinite(lo) and math.isfinite(hi) and -BOUND_LIMIT <= lo < hi <= BOUND_LIMIT):
      raise ValueError(f"reward range [{lo:g}, {hi:g}]: need finite bounds lo < hi within +-{BOUND_LIMIT:g}")
    self.reward_range, self._reported = (lo, hi), False
    self.path = str(path)
    self.lock = threading.Lock()
    self.db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
    self.db.execute("PRAGMA journal_mode=WAL")
    self.db.execute(f"PRAGMA synchronous={synchronous.upper()}")
    self.db.executescript(SCHEMA)
    have = {r[1] for r in self.db.execute("PRAGMA table_info(responses)")}
    for column in RAG_COLUMNS:
      if column not in have:
        self.db.execute(f"ALTER TABLE responses ADD COLUMN {column} TEXT")

  def close(self):
    with self.lock:
      self.db.close()

  def add_responses(self, rows: list[dict]) -> None:
    """Inserts response rows (dicts with the `responses` columns; JSON columns given as objects, the RAG
    ones as "question", "category", "passages", "input", "trace", optional) in one transaction."""
    now = time.time()
    opt_json = lambda r, k: None if r.get(k) is None else json.dumps(r[k])
    values = [(r["id"], r.get("created", now), r["variant"], json.dumps(r["request"]),
               json.dumps(r["messages"]), r["answer"], json.dumps(r["settings"]), r.get("choice", 0),
               r.get("prompt_tokens"), r.get("completion_tokens"), r.get("finish_reason"), r.get("question"),
               r.get("category"), opt_json(r, "passages"), opt_json(r, "input"), r.get("trace")) for r in rows]
    with self.lock:
      self.db.execute("BEGIN")
      self.db.executemany("INSERT INTO responses (id, created, variant, request_json, messages_json, answer, "
                          "settings_json, choice, prompt_tokens, completion_tokens, finish_reason, question, "
                          "category, passages_json, input_json, trace) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                          values)
      self.db.execute("COMMIT")

  def check_reward(self, reward) -> float:
    """The reward as a float; ValueError naming the value and the range unless a finite number in it."""
    lo, hi = self.reward_range
    if (isinstance(reward, bool) or not isinstance(reward, (int, float)) or not math.isfinite(reward)
        or not lo <= reward <= hi):
      raise ValueError(f"reward={reward!r}: expected a finite number in [{lo:g}, {hi:g}]")
    return float(reward)

  def add_feedback(self, response_id: str, reward: float, comment: str | None = None) -> tuple[int, str]:
    """Appends a reward; returns (feedback id, variant). UnknownResponse when the id is not logged,
    ValueError when the reward is not a finite number in `reward_range`."""
    fid, variant, _ = self.add_feedback_in_context(response_id, reward, comment)
    return fid, variant

  def add_feedback_in_context(self, response_id: str, reward: float,
                              comment: str | None = None) -> tuple[int, str, str | None]:
    """`add_feedback`, returning (feedback id, variant, the response's category or None)."""
    reward = self.check_reward(reward)
    with self.lock:
      row = self.db.execute("SELECT variant, category FROM responses WHERE id = ?", (response_id,)).fetchone()
      if row is None:
        raise UnknownResponse(response_id)
      cur = self.db.execute("INSERT INTO feedback(response_id, reward, comment, created) VALUES (?,?,?,?)",
                            (response_id, float(reward), comment, time.time()))
      return int(cur.lastrowid), row[0], row[1]

  def reward_sums(self, by_category: bool = False) -> dict:
    """{variant: {"n", "sum", "sum_sq", "binary"}} over all usable feedback (binary: every reward is 0 or 1);
    rewards that are not finite numbers are skipped, others clipped to `reward_range` (module doc).
    by_category: keyed by (variant, category), category None for responses without one."""
    lo, hi = self.reward_range
    group = "r.variant, r.category" if by_category else "r.variant, NULL"
    with self.lock:
      rows = self.db.execute(
          f"SELECT {group}, SUM(f.ok), SUM(CASE WHEN f.ok THEN f.c END), SUM(CASE WHEN f.ok THEN f.c * f.c END), "
          "SUM(f.ok AND f.c NOT IN (0, 1)), SUM(NOT f.ok), SUM(f.ok AND f.c != f.reward) "
          "FROM (SELECT response_id, reward, MIN(MAX(reward, ?), ?) AS c, "
          "      typeof(reward) IN ('real', 'integer') AND reward BETWEEN ? AND ? AS ok FROM feedback) f "
          f"JOIN responses r ON r.id = f.response_id GROUP BY {group}",
          (lo, hi, -sys.float_info.max, sys.float_info.max)).fetchall()
    skipped, clipped = sum(row[6] for row in rows), sum(row[7] for row in rows)
    if (skipped or clipped) and not self._reported:
      self._reported = True
      log.warning(f"reward log {self.path}: {skipped} feedback rewards that are not finite numbers skipped, "
                  f"{clipped} outside [{lo:g}, {hi:g}] clipped to it (the rows are kept as they are)")
    return {((v, c) if by_category else v): {"n": n, "sum": s or 0.0, "sum_sq": sq or 0.0, "binary": not other}
            for v, c, n, s, sq, other, _, _ in rows if n}

  def stats(self) -> dict[str, dict]:
    """{variant: {responses, feedback, mean_reward, ci95: [low, high]}} (see `ci95`)."""
    with self.lock:
      counts = dict(self.db.execute("SELECT variant, COUNT(*) FROM responses GROUP BY variant").fetchall())
    return _summaries(counts, self.reward_sums())

  def category_stats(self) -> dict[str, dict[str, dict]]:
    """{category: {variant: `stats` fields}} over responses that have a category."""
    with self.lock:
      rows = self.db.execute("SELECT category, variant, COUNT(*) FROM responses WHERE category IS NOT NULL "
                             "GROUP BY category, variant").fetchall()
    sums = self.reward_sums(by_category=True)
    out = {}
    for c in sorted({c for c, _, _ in rows} | {c for _, c in sums if c is not None}):
      counts = {v: n for cat, v, n in rows if cat == c}
      out[c] = _summaries(counts, {v: s for (v, cat), s in sums.items() if cat == c})
    return out

  def leaderboard(self) -> dict[str, list[dict]]:
    """{"all" and each category: [{variant, mean_reward, feedback, responses, ci95}]}, best mean reward
    first (variants without feedback last, by name)."""
    tables = {"all": self.stats(), **self.category_stats()}
    key = lambda item: (item[1]["mean_reward"] is None, -(item[1]["mean_reward"] or 0.0), item[0])
    return {c: [{"variant": v, **s} for v, s in sorted(t.items(), key=key)] for c, t in tables.items()}


def _summaries(counts: dict[str, int], sums: dict[str, dict]) -> dict[str, dict]:
  out = {}
  for v in sorted(set(counts) | set(sums)):
    s = sums.get(v, {"n": 0, "sum": 0.0, "sum_sq": 0.0})
    mean, lo, hi = ci95(s["n"], s["sum"], s["sum_sq"])
    out[v] = {"responses": counts.get(v, 0), "feedback": s["n"], "mean_reward": mean, "ci95": [lo, hi]}
  return out
