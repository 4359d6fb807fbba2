"""Reward log -> training data: SFT rows in the messages schema and preference pairs.

  python -m fineflax.data.from_feedback --log feedback.db --min-reward 1 --out data.jsonl \
      [--holdout 0.1 --holdout-out eval.jsonl] [--pairs-out pairs.jsonl] [--min-margin 0] [--no-context]

The log is the server's SQLite file with tables
  responses(id TEXT PRIMARY KEY, created REAL, variant TEXT, request_json TEXT, messages_json TEXT,
            answer TEXT, settings_json TEXT)
  feedback(id INTEGER PRIMARY KEY, response_id TEXT, reward REAL, comment TEXT, created REAL)
A response's reward is the MEAN of its feedback rows; responses without feedback are left out. Logs of
RAG variants also hold (`fineflax.serve.feedback`) question, category, passages_json and input_json: the
messages the generator answered from, retrieved context included.

SFT rows (`--out`): responses with reward >= min_reward, as {"messages": input + the assistant answer,
"id", "reward", "variant", "category"?, "passages"?} (what `fineflax.data.load_source` reads with schema
"messages"); input = the logged input_json when the response has one (the context the agent saw), else
the request messages; `--no-context` always takes the request messages (the ablation without context).
Deduplicated on (prompt, answer) where prompt = the request messages as canonical JSON: the copy with the
highest reward is kept (ties: the earliest). Rows are ordered by (created, id).
Held-out split (`--holdout F`): a prompt goes to `--holdout-out` when the first 8 hex digits of
sha256(prompt) / 16^8 < F, so a prompt's answers are all on one side and the split never changes when
rows are added. Preference pairs (`--pairs-out`, TRL's conversational form): per training prompt (the
request messages, so the answers of two variants to the same question meet here) with at least two
distinct answers, {"prompt": messages, "chosen": [assistant answer with the highest reward], "rejected":
[the lowest], "chosen_reward", "rejected_reward", "chosen_variant", "rejected_variant"} when the reward gap
is > min_margin (pairs of held-out prompts are left out). All outputs are written atomically.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import pathlib
import sqlite3
import sys
from typing import Iterable

from fineflax.data.schemas import RowError, from_messages
from fineflax.io import atomic_write_text

TABLES = {"responses": ("id", "created", "variant", "messages_json", "answer"),
          "feedback": ("response_id", "reward")}


class FeedbackLogError(ValueError):
  """A missing, unreadable or malformed reward log; the message names the file and what is wrong."""


def _connect(path) -> sqlite3.Connection:
  path = pathlib.Path(path)
  if not path.is_file():
    raise FeedbackLogError(f"{path}: no such reward log (expected the server's SQLite file)")
  try:
    con = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
    names = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
  except sqlite3.DatabaseError as e:
    raise FeedbackLogError(f"{path}: not a readable SQLite database ({e})") from None
  for table, cols in TABLES.items():
    if table not in names:
      raise FeedbackLogError(f"{path}: table {table!r} is missing (tables: {sorted(names)})")
    have = {r[1] for r in con.execute(f"PRAGMA table_info({table})")}
    missing = [c for c in cols if c not in have]
    if missing:
      raise FeedbackLogError(f"{path}: table {table!r} lacks columns {missing}")
  return con


def prompt_key(messages: list[dict]) -> str:
  return json.dumps(messages, sort_keys=True, ensure_ascii=False, separators=(",", ":"))


def in_holdout(key: str, fraction: float) -> bool:
  """sha256(key)[:8] / 16^8 < fraction: a fixed function of the prompt."""
  return int(hashlib.sha256(key.encode("utf-8")).hexdigest()[:8], 16) / 16 ** 8 < fraction


RAG_COLUMNS = ("category", "passages_json", "input_json")  # optional: logs of servers without RAG lack them


def _messages(text, column: str, answer: str) -> list[dict]:
  """The logged messages of `column` + the answer, checked against the messages schema; the prompt part."""
  try:
    prompt = json.loads(text)
  except (TypeError, json.JSONDecodeError) as e:
    raise RowError(f"{column} is not JSON ({e}): {str(text)[:60]!r}") from None
  return from_messages({"messages": list(prompt) + [{"role": "assistant", "content": answer}]})[:-1]


def read_log(path, on_bad_row: str = "error") -> list[dict]:
  """Rated responses as {"id", "created", "variant", "prompt" (request messages), "answer", "reward" (mean),
  "num_feedback", "category", "passages", "input" (messages with context, or None)}, ordered by
  (created, id). A row whose messages do not parse or fit the messages schema raises FeedbackLogError
  naming the response id (on_bad_row="skip": left out, counted on stderr)."""
  if on_bad_row not in ("error", "skip"):
    raise ValueError(f"on_bad_row={on_bad_row!r}; choose error or skip")
  con = _connect(path)
  try:
    have = {r[1] for r in con.execute("PRAGMA table_info(responses)")}
    rag = ", ".join(f"r.{c}" if c in have else "NULL" for c in RAG_COLUMNS)
    rows = con.execute(
        f"SELECT r.id, r.created, r.variant, r.messages_json, r.answer, AVG(f.reward), COUNT(f.reward), {rag} "
        "FROM responses r JOIN feedback f ON f.response_id = r.id WHERE f.reward IS NOT NULL "
        "GROUP BY r.id ORDER BY r.created, r.id").fetchall()
  except sqlite3.DatabaseError as e:
    raise FeedbackLogError(f"{path}: cannot read the log ({e})") from None
  finally:
    con.close()
  out, skipped = [], 0
  for rid, created, variant, messages_json, answer, reward, count, category, passages, inputs in rows:
    try:
      if not isinstance(answer, str) or not answer.strip():
        raise RowError(f"answer is empty or not text: {answer!r}")
      prompt = _messages(messages_json, "messages_json", answer)
      inputs = None if inputs is None else _messages(inputs, "input_json", answer)
      try:
        passages = None if passages is None else json.loads(passages)
      except json.JSONDecodeError as e:
        raise RowError(f"passages_json is not JSON ({e})") from None
    except (RowError, TypeError) as e:
      if on_bad_row == "error":
        raise FeedbackLogError(f"{path}: response {rid!r}: {e}") from None
      skipped += 1
      continue
    out.append({"id": rid, "created": created, "variant": variant, "prompt": prompt, "answer": answer,
                "reward": float(reward), "num_feedback": int(count), "category": category,
                "passages": passages, "input": inputs})
  if skipped:
    print(f"{path}: skipped {skipped} malformed responses", file=sys.stderr)
  return out


def sft_rows(records: Iterable[dict], min_reward: float, context: bool = True) -> list[dict]:
  """Deduplicated high-reward rows in the messages schema (see the module docstring); context: the input
  is the logged input_json (the context the agent saw) when there is one."""
  best: dict[tuple[str, str], dict] = {}
  source = lambda r: r["input"] if context and r.get("input") is not None else r["prompt"]
  for r in records:
    if r["reward"] < min_reward:
      continue
    k = (prompt_key(source(r)), r["answer"].strip())
    if k not in best or r["reward"] > best[k]["reward"]:
      best[k] = r
  kept = sorted(best.values(), key=lambda r: (r["created"], r["id"]))
  rag = lambda r: {k: r[k] for k in ("category", "passages") if r.get(k) is not None}
  return [{"messages": source(r) + [{"role": "assistant", "content": r["answer"]}], "id": r["id"],
           "reward": r["reward"], "variant": r["variant"], **rag(r)} for r in kept]


def preference_pairs(records: Iterable[dict], min_margin: float = 0.0) -> list[dict]:
  """Per prompt: best vs worst distinct answer when reward(best) - reward(worst) > min_margin."""
  by_prompt: dict[str, list[dict]] = {}
  for r in records:
    by_prompt.setdefault(prompt_key(r["prompt"]), []).append(r)
  pairs = []
  for rs in by_prompt.values():
    order = sorted(rs, key=lambda r: (-r["reward"], r["created"], r["id"]))
    chosen = order[0]
    rejected = next((r for r in reversed(order) if r["answer"].strip() != chosen["answer"].strip()), None)
    if rejected is None or chosen["reward"] - rejected["reward"] <= min_margin:
      continue
    pairs.append({"prompt": chosen["prompt"],
                  "chosen": [{"role": "assistant", "content": chosen["answer"]}],
                  "rejected": [{"role": "assistant", "content": rejected["answer"]}],
                  "chosen_reward": chosen["reward"], "rejected_reward": rejected["reward"],
                  "chosen_id": chosen["id"], "rejected_id": rejected["id"], "chosen_variant": chosen["variant"],
                  "rejected_variant": rejected["variant"], "_t": chosen["created"]})
  pairs.sort(key=lambda p: (p["_t"], p["chosen_id"]))
  return [{k: v for k, v in p.items() if k != "_t"} for p in pairs]


def _jsonl(rows: list[dict]) -> str:
  return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)


def convert(log, out, *, min_reward: float, holdout: float = 0.0, holdout_out=None, pairs_out=None,
            min_margin: float = 0.0, on_bad_row: str = "error", context: bool = True) -> dict:
  """Writes the outputs; returns counts {"rated", "train", "holdout", "pairs"}."""
  if not 0.0 <= holdout < 1.0:
    raise ValueError(f"--holdout must lie in [0, 1), got {holdout}")
  if holdout > 0 and not holdout_out:
    raise ValueError("--holdout needs --holdout-out FILE")
  records = read_log(log, on_bad_row)
  held = lambda r: holdout > 0 and in_holdout(prompt_key(r["prompt"]), holdout)
  train_records = [r for r in records if not held(r)]
  train = sft_rows(train_records, min_reward, context)
  held_rows = sft_rows([r for r in records if held(r)], min_reward, context)
  atomic_write_text(out, _jsonl(train))
  if holdout_out:
    atomic_write_text(holdout_out, _jsonl(held_rows))
  counts = {"rated": len(records), "train": len(train), "holdout": len(held_rows)}
  if pairs_out:
    pairs = preference_pairs(train_records, min_margin)
    atomic_write_text(pairs_out, _jsonl(pairs))
    counts["pairs"] = len(pairs)
  return counts


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(prog="python -m fineflax.data.from_feedback",
                               description="Reward log (SQLite) -> SFT rows (messages schema) and preference pairs")
  ap.add_argument("--log", required=True, help="the server's SQLite reward log")
  ap.add_argument("--min-reward", type=float, required=True, help="keep responses whose mean reward >= R")
  ap.add_argument("--out", required=True, help="SFT rows (JSONL, messages schema)")
  ap.add_argument("--holdout", type=float, default=0.0, help="share of prompts held out (hash split)")
  ap.add_argument("--holdout-out", default=None, help="held-out rows (JSONL, messages schema)")
  ap.add_argument("--pairs-out", default=None, help="preference pairs (JSONL, TRL prompt/chosen/rejected)")
  ap.add_argument("--min-margin", type=float, default=0.0, help="pairs need reward gap > this")
  ap.add_argument("--on-bad-row", default="error", choices=("error", "skip"))
  ap.add_argument("--no-context", dest="context", action="store_false",
                  help="SFT inputs are the request messages, not the logged context of RAG answers")
  args = ap.parse_args(argv)
  try:
    counts = convert(args.log, args.out, min_reward=args.min_reward, holdout=args.holdout,
                     holdout_out=args.holdout_out, pairs_out=args.pairs_out, min_margin=args.min_margin,
                     on_bad_row=args.on_bad_row, context=args.context)
  except (FeedbackLogError, ValueError) as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  print(json.dumps(counts))
  return 0


if __name__ == "__main__":
  sys.exit(main())
