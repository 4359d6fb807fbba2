"""`python -m fineflax.inspect_data` (`fineflax.data.inspect`): its counts equal what the batch iterator produces, the shown rows are
the kept ids with exactly the assistant turns marked, the text marks trained tokens, and the command runs
on configs/quickstart.py with overrides and --json."""
import importlib.util
import json
import os
import subprocess
import sys

import pytest

from fineflax.data import Mixture, load_source, make_batch_iterator
from fineflax.data.inspect import GREEN, batch_efficiency, format_report, inspect_config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def quickstart():
  spec = importlib.util.spec_from_file_location("quickstart", os.path.join(ROOT, "configs", "quickstart.py"))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config()


@pytest.fixture(scope="module")
def report():
  return inspect_config(quickstart(), n=2, max_rows=120)  # train: its first 120 of 400 rows; eval: all 64


def test_counts_equal_the_batch_iterator(report):
  from fineflax.models import load_tokenizer
  tok = load_tokenizer("smollm2-135m-instruct")
  cfg = quickstart().data
  train, ev = report["sources"]
  assert (train["split"], ev["split"]) == ("train", "eval")
  assert train["name"].endswith("arithmetic_messages.jsonl") and ev["name"].endswith("eval_messages.jsonl")
  for s in (train, ev):
    src = load_source(s["name"])
    st = s["stats"]
    assert st["rows"] == len(src) and st["scanned"] == st["examples"] + st["dropped"] == min(len(src), 120)
    it = make_batch_iterator(Mixture([(src, 1.0)], shuffle=False), tok, batch_size=st["scanned"],
                             max_length=cfg.max_length, packing=False)
    batch = next(it)  # the scanned rows, once each
    assert st["tokens"] == batch["attention_mask"].sum() and st["trained_tokens"] == batch["loss_mask"].sum()
    assert st["truncated"] == it.stats["truncated"] > 0
    assert st["trained_share"] == pytest.approx(st["trained_tokens"] / st["tokens"])
    assert st["length_ids"]["max"] > cfg.max_length >= st["length_ids"]["p50"]
  json.dumps(report)  # JSON-able


def test_shown_rows_mark_exactly_the_assistant_turns(report):
  train = report["sources"][0]
  src = load_source(train["name"])
  for k, shown in enumerate(train["examples"]):
    trained = [g["text"] for g in shown["segments"] if g["trained"]]
    replies = [m["content"] + "<|im_end|>" for m in src[k]["messages"] if m["role"] == "assistant"]
    assert trained == replies[:len(trained)] and trained
    assert shown["where"] == src[k]["where"]
  text = format_report(report, color=False)
  first = train["examples"][0]
  assert "[[" + [g for g in first["segments"] if g["trained"]][0]["text"] + "]]" in text
  assert "rows 400 (scanned 120, skipped at load 0)" in text and GREEN not in text
  assert GREEN + [g for g in first["segments"] if g["trained"]][0]["text"] in format_report(report, True)


@pytest.mark.fast
def test_batch_efficiency_first_fit_and_buckets():
  # packed: 10 and 40 share row 0, 30 goes to row 1 -> one batch of 2 x 64 slots;
  # padded: [10, 40] -> bucket 64, [30] -> bucket 32, 2 rows each
  assert batch_efficiency([10, 40, 30], 2, 64) == {"packed": 80 / 128, "padded": 80 / (128 + 64)}
  assert batch_efficiency([], 2, 64) == {"packed": None, "padded": None}


def test_cli_json_with_overrides_reports_the_dropped_glaive_rows():
  r = subprocess.run([sys.executable, "-m", "fineflax.inspect_data", "--config", "configs/quickstart.py",
                      "--config.data.sources=tools_glaive.jsonl", "--config.data.eval_sources=", "--n", "1",
                      "--max_rows", "40", "--json"], cwd=ROOT, capture_output=True, text=True, timeout=300,
                     env={**os.environ, "PYTHONPATH": ROOT})
  assert r.returncode == 0, r.stderr
  out = json.loads(r.stdout)
  [src] = out["sources"]
  assert out["data"]["max_length"] == 64 and src["stats"]["dropped_no_loss"] == 40 == src["stats"]["scanned"]
  assert src["stats"]["dropped_why"].startswith("no assistant token within max_length=64; the shortest prompt")
  assert src["examples"][0]["dropped"].startswith("no assistant token within max_length=64; the prompt is ")


@pytest.mark.fast
def test_cli_misspelled_source_or_config_is_one_line_with_the_closest_names(tmp_path):
  def run(*args):
    r = subprocess.run([sys.executable, "-m", "fineflax.inspect_data", *args], cwd=tmp_path, capture_output=True,
                       text=True, timeout=300, env={**os.environ, "PYTHONPATH": ROOT})
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
    return r.stderr.strip()
  # run from another folder: the README's relative config path is found in the checkout
  assert run("--config", "configs/quickstart.py", "--source", "arithmetic_mesages") == (
      "error: --source='arithmetic_mesages' matches none of the config's sources; closest: "
      "arithmetic_messages.jsonl, arithmetic_eval_messages.jsonl")
  assert "closest: configs/quickstart.py" in run("--config", "configs/quickstart.pyy")
