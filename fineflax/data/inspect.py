r"""See what an SFT config trains on, without loading model weights.

  python -m fineflax.inspect_data --config configs/quickstart.py [--source S] [--n 3] [--json]
                                  [--max_rows 2000] [--config.data.max_length=128 ...]

For each source of `config.data.sources` (and `config.data.eval_sources`, marked eval), loaded as the SFT
job loads them (`fineflax.data.sources.load_sources`) and formatted by the configured tokenizer and chat
template (`fineflax.models.load_tokenizer(config.model.source)`: the tokenizer only) with
`fineflax.data.prepare.prepare`, the code path of the batch iterator:

  - the first `--n` rows as the model sees them: the ids kept after truncation to max_length + 1, decoded,
    with the trained tokens (targets whose loss_mask is 1) in green on a terminal, in [[double brackets]]
    otherwise; a dropped row is shown whole with the reason;
  - statistics over the first `--max_rows` rows (0 = all): rows, malformed rows skipped at load, examples
    kept, tokens (= the positions a kept example fills, ids - 1) and the trained share of them, rows
    dropped by reason, rows truncated, and percentiles of the whole conversation's length in ids;
  - the batch efficiency (real tokens / batch slots), packed into rows of max_length by first fit, as the
    iterator packs, and padded to length buckets one example a row, as it does without packing.

`--json` prints the same as one JSON object (`inspect_config(config, ...)` returns it). The command line is
`fineflax.inspect_data` (it parses a job's config flags, so it sits above the jobs).
"""
from __future__ import annotations

import difflib
import os

import numpy as np

from fineflax.config_checks import ConfigError

from fineflax.data.chat import tokenize_chat
from fineflax.data.packing import bucket_width, default_buckets, first_fit, truncate
from fineflax.data.sources import load_sources
from fineflax.data.prepare import (DROP_REASONS, Prepared, account, drop_summary, new_source_stats,
                                   prepare)

GREEN, RESET = "\033[1;32m", "\033[0m"
PERCENTILES = (50, 90, 99)


def segments(tokenizer, ids: np.ndarray, trained: np.ndarray) -> list[dict]:
  """[{"text", "trained"}]: the ids decoded in runs of equal `trained` flags."""
  out, start = [], 0
  for k in range(1, len(ids) + 1):
    if k == len(ids) or trained[k] != trained[start]:
      out.append({"text": tokenizer.decode(ids[start:k].tolist()), "trained": bool(trained[start])})
      start = k
  return out


def shown_row(tokenizer, example: dict, p: Prepared, max_length: int, truncation: str) -> dict:
  """One row as the model sees it: the ids kept by truncation, flagged where they are loss targets
  (assistant ids after the first); a dropped row whole, nothing flagged, with the reason."""
  ids, assistant = tokenize_chat(tokenizer, example["messages"])
  if p.seq is None:
    flags, reason = np.zeros(len(ids), bool), (
        f"{p.num_ids} ids > max_length + 1 = {max_length + 1} with truncation='drop'"
        if p.reason == "dropped_too_long" else
        f"no assistant token within the last max_length={max_length} tokens (truncation='left')"
        if truncation == "left" else
        f"no assistant token within max_length={max_length}; the prompt is {p.prompt} tokens")
  else:
    ids, flags = truncate(ids, assistant, max_length + 1, truncation)
    flags, reason = np.asarray(flags, bool).copy(), None
    flags[0] = False  # the first id is never a target
  return {"where": example["where"], "ids": p.num_ids, "kept_ids": 0 if p.seq is None else len(ids),
          "truncated": p.seq is not None and p.truncated, "trained_tokens": int(flags.sum()),
          "dropped": reason, "segments": segments(tokenizer, ids, flags)}


def _percentiles(values) -> dict:
  if not values:
    return {}
  v = np.asarray(values)
  return {**{f"p{q}": int(np.percentile(v, q)) for q in PERCENTILES}, "max": int(v.max())}


def batch_efficiency(lengths, batch_size: int, max_length: int, buckets=None) -> dict:
  """Real tokens / batch slots for sequences of `lengths` (positions) in row order: first-fit packing into
  `batch_size` rows of max_length (a sequence that fits no row starts the next batch), and one sequence a
  row padded to the batch's bucket."""
  if not lengths:
    return {"packed": None, "padded": None}
  fill, packed_batches = [0] * batch_size, 1
  for n in lengths:
    r = first_fit(fill, n, max_length)
    if r < 0:
      fill, packed_batches = [0] * batch_size, packed_batches + 1
      r = 0
    fill[r] += n
  buckets = buckets or default_buckets(max_length)
  padded_slots = sum(bucket_width(max(lengths[i:i + batch_size]), buckets) * batch_size
                     for i in range(0, len(lengths), batch_size))
  total = sum(lengths)
  return {"packed": total / (packed_batches * batch_size * max_length), "padded": total / padded_slots}


def inspect_source(source, tokenizer, data_cfg, n: int = 3, max_rows: int = 2000) -> dict:
  """The report of one source (see the module docstring) as a JSON-able dict."""
  max_length, truncation = int(data_cfg.max_length), str(data_cfg.truncation)
  count = len(source) if not max_rows else min(len(source), max_rows)
  shown, lengths, ids_per_row = [], [], []
  stats = new_source_stats(source.name)
  for i in range(count):
    example = source[i]
    p = prepare(tokenizer, example["messages"], max_length, truncation)
    account(stats, p)
    ids_per_row.append(p.num_ids)
    if p.seq is not None:
      lengths.append(len(p.seq[0]))
    if len(shown) < n:
      shown.append(shown_row(tokenizer, example, p, max_length, truncation))
  stats = {"rows": len(source), "scanned": count, **source.skip_report(), **stats}
  stats["trained_share"] = stats["trained_tokens"] / stats["tokens"] if stats["tokens"] else 0.0
  stats["dropped"] = sum(stats[r] for r in DROP_REASONS)
  stats["dropped_why"] = drop_summary(stats, max_length, truncation) if stats["dropped"] else ""
  stats["length_ids"] = _percentiles(ids_per_row)
  stats["efficiency"] = batch_efficiency(lengths, int(data_cfg.batch_size), max_length)
  return {"name": source.name, "schema": source.schema, "examples": shown, "stats": stats}


def inspect_config(config, source: str | None = None, n: int = 3, max_rows: int = 2000) -> dict:
  """The report of every source of `config.data` whose name contains `source` (all when None)."""
  from fineflax.models import load_tokenizer
  data = config.data
  tokenizer = load_tokenizer(config.model.source)
  entries = [("train", e) for e in load_sources(data.sources, data)]
  if data.get("eval_sources"):
    entries += [("eval", e) for e in load_sources(data.eval_sources, data)]
  report = {"model": str(config.model.source), "data": {
      k: data.get(k) for k in ("max_length", "truncation", "packing", "batch_size", "schema", "on_bad_row")},
      "sources": []}
  for split, entry in entries:
    src = entry["source"]
    if source and source not in src.name:
      continue
    r = inspect_source(src, tokenizer, data, n=n, max_rows=max_rows)
    report["sources"].append({"split": split, "weight": entry["weight"], **r})
  if not report["sources"]:
    raise ConfigError(no_source_message(source, [e["source"].name for _, e in entries]))
  return report


def no_source_message(source: str, names: list[str]) -> str:
  """One line: `source` matches no source name; the closest source file names (or all of them)."""
  files = [os.path.basename(n) for n in names]
  stems = {os.path.splitext(f)[0]: f for f in files}
  close = [stems.get(m, m) for m in difflib.get_close_matches(source, [*stems, *files], n=3, cutoff=0.5)]
  hint = f"closest: {', '.join(dict.fromkeys(close))}" if close else f"the sources are {', '.join(files)}"
  return f"--source={source!r} matches none of the config's sources; {hint}"


def _pct(x) -> str:
  return "-" if x is None else f"{100 * x:.1f}%"


def format_report(report: dict, color: bool) -> str:
  """The report as text; trained tokens in green (`color`) or [[brackets]]."""
  d = report["data"]
  lines = [f"model {report['model']} (tokenizer only); max_length={d['max_length']} "
           f"truncation={d['truncation']} packing={d['packing']} batch_size={d['batch_size']}"]
  mark = (lambda t: f"{GREEN}{t}{RESET}") if color else (lambda t: f"[[{t}]]")
  for s in report["sources"]:
    st = s["stats"]
    lines += ["", f"== {_short(s['name'])} ({s['split']}, weight {s['weight']:g}, schema {s['schema']}) =="]
    for ex in s["examples"]:
      head = f"-- {_short(ex['where'])}: {ex['ids']} ids"
      if ex["dropped"]:
        head += f", DROPPED: {ex['dropped']}"
      else:
        head += f", {ex['kept_ids']} kept, {ex['trained_tokens']} trained"
      text = "".join(mark(g["text"]) if g["trained"] else g["text"] for g in ex["segments"])
      if ex["truncated"]:
        cut = f"[... {ex['ids'] - ex['kept_ids']} ids cut by truncation={d['truncation']}]"
        text = f"{cut}\n{text}" if d["truncation"] == "left" else f"{text}\n{cut}"
      lines += [head + " --", text]
    eff = st["efficiency"]
    dropped = ", ".join(f"{st[r]} {r.removeprefix('dropped_').replace('_', ' ')}" for r in DROP_REASONS)
    if st["dropped"]:
      dropped += ": " + st["dropped_why"]
    lengths = " ".join(f"{k} {v}" for k, v in st["length_ids"].items())
    lines += [
        f"rows {st['rows']} (scanned {st['scanned']}, skipped at load {st['skipped']}); examples "
        f"{st['examples']}; tokens {st['tokens']:,}, trained {st['trained_tokens']:,} "
        f"({_pct(st['trained_share'])})",
        f"dropped {st['dropped']} ({dropped}); truncated {st['truncated']}",
        f"conversation length in ids: {lengths}",
        f"batch efficiency (real tokens / slots): packed {_pct(eff['packed'])}, "
        f"padded to buckets {_pct(eff['padded'])}"
        f" (configured: {'packed' if d['packing'] else 'padded'})"]
    lines += [f"skipped: {w}" for w in st["skipped_first"]]
  return "\n".join(lines)


def _short(path: str) -> str:
  """`path` relative to the working directory when that is shorter."""
  try:
    rel = os.path.relpath(path)
  except ValueError:
    return path
  return rel if len(rel) < len(path) else path
