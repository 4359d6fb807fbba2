"""Benchmarks by name, found by their `data_source` in the papers' evaluation files.

A benchmark is a set of data-source names (any case) and a grader:
  math   math-verify on the completion, as LUFFY's evaluation (the `math` reward; with the </think> gate of
         `math_think` when the prompt ends with "<think>\\n", as eval_scripts/generate_vllm.py decides)
  qa     exact match of the final <answer> after SQuAD normalisation, as Search-R1's qa_em (`exact_match`)
Files: `discover(dir)` looks at every .parquet / .jsonl file under dir (two levels) whose name has no "train",
detects its format from its columns (`fineflax.data.rl_prompts.FORMATS`: LUFFY's valid.parquet, Search-R1's
test parquets, GSM8K, MATH) and reads which data sources it holds; a benchmark found in two files is an
error that names both (pass the files themselves instead).
"""
from __future__ import annotations

import dataclasses
import json
import pathlib

from fineflax.data.rl_prompts import FORMATS, FieldMap, first_row, resolve_files
from fineflax.data.sources import DataError


@dataclasses.dataclass(frozen=True)
class Benchmark:
  name: str
  sources: tuple[str, ...]
  grader: str  # "math" or "qa"


BENCHMARKS = {b.name: b for b in [
    Benchmark("math500", ("math", "math500", "math-500", "huggingfaceh4/math-500"), "math"),  # LUFFY: "math"
    Benchmark("aime24", ("aime", "aime24", "aime2024"), "math"),  # LUFFY's valid.parquet: "aime"
    Benchmark("aime25", ("aime25", "aime2025"), "math"),
    Benchmark("amc23", ("amc", "amc23"), "math"),
    Benchmark("minerva", ("minerva", "minerva_math"), "math"),
    Benchmark("olympiadbench", ("olympiad_bench", "olympiadbench"), "math"),
    Benchmark("gsm8k", ("openai/gsm8k", "gsm8k"), "math"),
    Benchmark("hendrycks_math", ("lighteval/math", "hendrycks_math"), "math"),
    *[Benchmark(n, (n,), "qa") for n in ("nq", "triviaqa", "popqa", "hotpotqa", "2wikimultihopqa", "musique",
                                           "bamboogle")],
]}
FORMAT_COLUMNS = [("search_r1", {"question", "golden_answers"}), ("luffy", {"prompt", "reward_model"}),
                  ("gsm8k", {"question", "answer"}), ("math", {"problem", "solution"})]


def benchmark_of(source: str) -> str | None:
  """The benchmark whose sources include `source` (case-insensitive), or None."""
  s = str(source).lower()
  return next((b.name for b in BENCHMARKS.values() if s in b.sources), None)


def detect_format(columns) -> str | None:
  cols = set(columns)
  return next((name for name, need in FORMAT_COLUMNS if need <= cols), None)


def sources_in(path: pathlib.Path, fm: FieldMap) -> set[str]:
  """The data sources a file holds: its data_source column's values, or the format's one source name."""
  if not fm.data_source:
    return {fm.source_name}
  if path.suffix.lower() == ".parquet":
    import pyarrow.parquet as pq
    return {str(v) for v in pq.read_table(path, columns=[fm.data_source.split(".")[0]]).column(0).to_pylist()
            if v is not None}
  out = set()
  with open(path, encoding="utf-8") as f:
    for line in f:
      if line.strip():
        value = json.loads(line).get(fm.data_source)
        if value is not None:
          out.add(str(value))
  return out


def discover(paths) -> dict[str, tuple[pathlib.Path, str]]:
  """{benchmark: (file, format)} of the evaluation files in `paths` (a folder, or files: module docstring)."""
  files = []
  for p in paths:
    p = pathlib.Path(p).expanduser()
    if p.is_dir():
      found = sorted([*p.glob("*.parquet"), *p.glob("*.jsonl"), *p.glob("*/*.parquet"), *p.glob("*/*.jsonl")])
      files += [f for f in found if "train" not in f.name.lower()]
    else:
      files += resolve_files(str(p)) or []
  out: dict[str, tuple[pathlib.Path, str]] = {}
  for path in files:
    columns, _, _ = first_row(path)
    fmt = detect_format(columns)
    if fmt is None:
      continue
    for source in sources_in(path, FORMATS[fmt]):
      name = benchmark_of(source)
      if name is None:
        continue
      if name in out and out[name][0] != path:
        raise DataError(f"benchmark {name} is in both {out[name][0]} and {path}; pass --files to choose")
      out[name] = (path, fmt)
  return out
