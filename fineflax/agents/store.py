"""The agent store (SQLite): rollouts, attempts, spans and resource versions; queryable, exportable to JSONL.

Tables (JSON columns hold text):
  rollouts(rollout_id, task, mode, group_id, status, reward, created, finished)
      status: queued -> running -> succeeded | failed
  attempts(attempt_id, rollout_id, number, status, error, started, finished)     retries of a rollout
  spans(rollout_id, attempt_id, seq, kind, name, start, end, attributes)         see `tracing.Span`
  resources(name, version, value, meta, created)                                 e.g. prompt templates
Durability: WAL journal with synchronous=FULL and one transaction per write, so a span is on disk when
`add_span` returns; a process killed mid-rollout (SIGKILL) loses no finished span, and its rollout stays
"running" (`rollouts(status="running")` finds it). One connection shared by the runner threads under a lock.
"""
from __future__ import annotations

import json
import sqlite3
import threading
import time
import uuid

from fineflax.agents.tracing import Span

SCHEMA = """
CREATE TABLE IF NOT EXISTS rollouts (rollout_id TEXT PRIMARY KEY, task TEXT, mode TEXT, group_id TEXT,
  status TEXT, reward REAL, created REAL, finished REAL);
CREATE TABLE IF NOT EXISTS attempts (attempt_id TEXT PRIMARY KEY, rollout_id TEXT, number INTEGER, status TEXT,
  error TEXT, started REAL, finished REAL);
CREATE TABLE IF NOT EXISTS spans (rollout_id TEXT, attempt_id TEXT, seq INTEGER, kind TEXT, name TEXT,
  start REAL, "end" REAL, attributes TEXT, PRIMARY KEY (attempt_id, seq));
CREATE TABLE IF NOT EXISTS resources (name TEXT, version INTEGER, value TEXT, meta TEXT, created REAL,
  PRIMARY KEY (name, version));
CREATE INDEX IF NOT EXISTS spans_rollout ON spans (rollout_id, attempt_id, seq);
CREATE INDEX IF NOT EXISTS rollouts_group ON rollouts (group_id);
"""


class Store:
  def __init__(self, path: str = ":memory:"):
    self.path = str(path)
    self._lock = threading.RLock()
    self.db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
    self.db.row_factory = sqlite3.Row
    if self.path != ":memory:":
      self.db.execute("PRAGMA journal_mode=WAL")
    self.db.execute("PRAGMA synchronous=FULL")
    self.db.executescript(SCHEMA)

  def _write(self, sql: str, params=()):
    with self._lock:
      self.db.execute("BEGIN IMMEDIATE")
      try:
        self.db.execute(sql, params)
        self.db.execute("COMMIT")
      except BaseException:
        self.db.execute("ROLLBACK")
        raise

  # rollouts and attempts --------------------------------------------------------------------------
  def add_rollout(self, task, mode: str = "train", group_id: str = "") -> str:
    rid = uuid.uuid4().hex[:16]
    self._write("INSERT INTO rollouts VALUES (?,?,?,?,?,?,?,?)",
                (rid, json.dumps(task, default=str), mode, group_id, "queued", None, time.time(), None))
    return rid

  def start_attempt(self, rollout_id: str) -> tuple[str, int]:
    """(attempt_id, attempt number from 1); the rollout becomes "running"."""
    with self._lock:
      n = self.db.execute("SELECT COUNT(*) FROM attempts WHERE rollout_id=?", (rollout_id,)).fetchone()[0] + 1
      aid = f"{rollout_id}-{n}"
      self._write("INSERT INTO attempts VALUES (?,?,?,?,?,?,?)", (aid, rollout_id, n, "running", None,
                                                                  time.time(), None))
      self._write("UPDATE rollouts SET status='running' WHERE rollout_id=?", (rollout_id,))
    return aid, n

  def finish_attempt(self, attempt_id: str, status: str, error: str | None = None) -> None:
    self._write("UPDATE attempts SET status=?, error=?, finished=? WHERE attempt_id=?",
                (status, error, time.time(), attempt_id))

  def finish_rollout(self, rollout_id: str, status: str, reward: float | None) -> None:
    self._write("UPDATE rollouts SET status=?, reward=?, finished=? WHERE rollout_id=?",
                (status, reward, time.time(), rollout_id))

  def add_span(self, span: Span) -> None:
    self._write('INSERT INTO spans VALUES (?,?,?,?,?,?,?,?)',
                (span.rollout_id, span.attempt_id, span.seq, span.kind, span.name, span.start, span.end,
                 json.dumps(span.attributes)))

  # queries ----------------------------------------------------------------------------------------
  def query(self, sql: str, params=()) -> list[dict]:
    """Rows of a read-only SQL query as dicts (e.g. "SELECT kind, COUNT(*) n FROM spans GROUP BY kind")."""
    with self._lock:
      return [dict(r) for r in self.db.execute(sql, params).fetchall()]

  def rollouts(self, status: str | None = None, group_id: str | None = None, mode: str | None = None) -> list[dict]:
    where, params = _where(status=status, group_id=group_id, mode=mode)
    rows = self.query(f"SELECT * FROM rollouts{where} ORDER BY created, rollout_id", params)
    for r in rows:
      r["task"] = json.loads(r["task"])
    return rows

  def attempts(self, rollout_id: str) -> list[dict]:
    return self.query("SELECT * FROM attempts WHERE rollout_id=? ORDER BY number", (rollout_id,))

  def spans(self, rollout_id: str | None = None, attempt_id: str | None = None, kind: str | None = None) -> list[Span]:
    where, params = _where(rollout_id=rollout_id, attempt_id=attempt_id, kind=kind)
    rows = self.query(f"SELECT * FROM spans{where} ORDER BY rollout_id, attempt_id, seq", params)
    return [Span(r["rollout_id"], r["attempt_id"], r["seq"], r["kind"], r["name"], r["start"], r["end"],
                 json.loads(r["attributes"])) for r in rows]

  # resources --------------------------------------------------------------------------------------
  def add_resource(self, name: str, value, meta: dict | None = None) -> int:
    """Stores a new version of resource `name` (1, 2, ...); returns its version."""
    with self._lock:
      v = self.db.execute("SELECT COALESCE(MAX(version), 0) FROM resources WHERE name=?", (name,)).fetchone()[0] + 1
      self._write("INSERT INTO resources VALUES (?,?,?,?,?)",
                  (name, v, json.dumps(value), json.dumps(meta or {}, default=str), time.time()))
    return v

  def resource(self, name: str, version: int | None = None) -> dict:
    """{"name", "version", "value", "meta"} of a version (default the latest); KeyError names what is missing."""
    sql = "SELECT * FROM resources WHERE name=? " + ("AND version=?" if version else "ORDER BY version DESC LIMIT 1")
    rows = self.query(sql, (name, version) if version else (name,))
    if not rows:
      raise KeyError(f"resource {name!r}" + (f" version {version}" if version else "") + f" is not in {self.path}")
    r = rows[0]
    return {"name": r["name"], "version": r["version"], "value": json.loads(r["value"]), "meta": json.loads(r["meta"])}

  def resource_versions(self, name: str) -> list[dict]:
    return [self.resource(name, r["version"]) for r in
            self.query("SELECT version FROM resources WHERE name=? ORDER BY version", (name,))]

  # export -----------------------------------------------------------------------------------------
  def export_jsonl(self, path: str) -> int:
    """Every rollout with its attempts and spans, one JSON object a line (written atomically); returns
    the number of rollouts."""
    from fineflax.io import atomic_write_text
    lines = []
    for r in self.rollouts():
      r["attempts"] = self.attempts(r["rollout_id"])
      r["spans"] = [vars(s) for s in self.spans(rollout_id=r["rollout_id"])]
      lines.append(json.dumps(r))
    atomic_write_text(path, "".join(line + "\n" for line in lines))
    return len(lines)

  def close(self):
    with self._lock:
      self.db.close()


def _where(**filters) -> tuple[str, tuple]:
  keys = [k for k, v in filters.items() if v is not None]
  if not keys:
    return "", ()
  return " WHERE " + " AND ".join(f"{k}=?" for k in keys), tuple(filters[k] for k in keys)
