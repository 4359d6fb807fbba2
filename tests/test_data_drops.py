"""Dropped examples: when every row is dropped the batch iterator stops at once with the counts and the
reason (it looped forever before), a source whose dropped share passes the threshold is warned about once,
and `summary()` reports drops and skipped rows per source."""
import threading

import numpy as np
import pytest

from fineflax.data import DataError, build_mixture, load_source, make_batch_iterator, tokenize_chat
from fineflax.data.iterator import BatchIterator


@pytest.fixture(scope="module")
def tok():
  from fineflax.models import load_tokenizer
  return load_tokenizer("smollm2-135m-instruct")


@pytest.fixture(scope="module")
def glaive():
  return load_source("sample:tools_glaive.jsonl")


def first_batch_or_error(it, timeout=60.0):
  """next(it) in a thread: (batch, None) or (None, exception); fails the test if it does not return."""
  out = {}
  def work():
    try:
      out["batch"] = next(it)
    except Exception as e:  # noqa: BLE001 - handed to the test
      out["error"] = e
  t = threading.Thread(target=work, daemon=True)
  t.start()
  t.join(timeout)
  assert not t.is_alive(), f"next(batches) did not return within {timeout} s"
  return out.get("batch"), out.get("error")


@pytest.mark.parametrize("packing", [True, False])
def test_all_rows_dropped_is_an_error_with_counts_and_reason(tok, glaive, packing):
  prompts = [int(np.argmax(tokenize_chat(tok, glaive[i]["messages"])[1])) for i in range(len(glaive))]
  assert min(prompts) > 65  # the premise: no row has an assistant token within 64 + 1 ids
  it = make_batch_iterator(build_mixture([{"source": glaive}]), tok, batch_size=4, max_length=64,
                           packing=packing)
  batch, err = first_batch_or_error(it)
  assert batch is None and isinstance(err, DataError)
  assert (f"tools_glaive.jsonl: all {len(glaive)} rows dropped: no assistant token within max_length=64; "
          f"the shortest prompt is {min(prompts)} tokens") in str(err)
  assert it.stats["dropped_no_loss"] >= len(glaive) and it.stats["examples"] == 0


def test_all_rows_too_long_with_truncation_drop(tok, glaive):
  it = make_batch_iterator(build_mixture([{"source": glaive}]), tok, batch_size=4, max_length=64,
                           truncation="drop")
  _, err = first_batch_or_error(it)
  lengths = [len(tokenize_chat(tok, glaive[i]["messages"])[0]) for i in range(len(glaive))]
  assert (f"all 200 rows dropped: longer than max_length + 1 = 65 ids with truncation='drop'; the shortest "
          f"is {min(lengths)} ids") in str(err)


def test_dropped_share_warns_once_and_good_sources_keep_going(tok, glaive, caplog):
  mix = build_mixture([{"source": glaive, "weight": 1}, {"source": "sample:arithmetic_messages.jsonl",
                                                         "weight": 1}], seed=0)
  it = make_batch_iterator(mix, tok, batch_size=8, max_length=64, packing=False)
  with caplog.at_level("WARNING", logger="fineflax.data"):
    batches = [next(it) for _ in range(20)]
  assert all(b["loss_mask"].sum() > 0 for b in batches)
  warnings = [r.getMessage() for r in caplog.records if r.name == "fineflax.data"]
  assert len(warnings) == 1 and "tools_glaive.jsonl: 50 of 50 examples dropped (100%" in warnings[0]
  assert "no assistant token within max_length=64" in warnings[0]
  summary = it.summary()
  g, a = summary["sources"]
  assert g["rows"] == 200 and g["examples"] == 0 and g["dropped_no_loss"] == g["drawn"] > 50
  assert a["dropped_no_loss"] + a["dropped_too_long"] == 0 and a["examples"] == summary["examples"] == 160
  assert summary["dropped_no_loss"] == g["drawn"] and g["skipped"] == 0


def test_summary_reports_rows_skipped_at_load(tok, tmp_path):
  path = tmp_path / "chat.jsonl"
  good = '{"messages": [{"role": "user", "content": "1 + 1?"}, {"role": "assistant", "content": "2"}]}'
  path.write_text("\n".join([good, "{oops", good, '{"messages": 3}', good]) + "\n")
  it = make_batch_iterator(build_mixture([{"source": str(path), "on_bad_row": "skip"}]), tok,
                           batch_size=2, max_length=64)
  next(it)
  [src] = it.summary()["sources"]
  assert src["rows"] == 3 and src["skipped"] == 2
  assert [r.split(":")[1] for r in src["skipped_first"]] == ["line 2", "line 4"]


def test_error_after_too_many_drops_in_a_row_before_any_example(tok, glaive):
  it = BatchIterator(build_mixture([{"source": glaive}]), tok, 4, 64, max_dropped_in_a_row=10)
  _, err = first_batch_or_error(it)
  assert isinstance(err, DataError) and str(err).startswith("the first 10 examples were all dropped; ")


def test_all_dropped_is_detected_after_a_mid_epoch_restore(tok, glaive):
  it = make_batch_iterator(build_mixture([{"source": glaive}]), tok, batch_size=4, max_length=64)
  it.restore({"mixture": {"step": 77, "counts": [77]}, "batches": 3, "stats": {}})
  _, err = first_batch_or_error(it)
  assert "all 200 rows dropped" in str(err)
  assert it.source_stats[0]["drawn"] == (200 - 77) + 200  # the rest of epoch 0, then all of epoch 1
