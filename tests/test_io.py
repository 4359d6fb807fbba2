"""fineflax.io: invalid JSON names the file; a failed atomic write leaves the old file and no debris."""
import os

import pytest

from fineflax import io as ffio

pytestmark = pytest.mark.fast


def test_read_json_names_the_file(tmp_path):
  p = tmp_path / "config.json"
  p.write_text('{"a": 1,}')
  with pytest.raises(ValueError, match=r"config.json: invalid JSON \(.*line 1"):
    ffio.read_json(p)
  p.write_text('{"a": [1, 2]}')
  assert ffio.read_json(p) == {"a": [1, 2]}


def test_failed_atomic_write_keeps_the_old_file(tmp_path, monkeypatch):
  p = tmp_path / "history.json"
  ffio.atomic_write_text(p, "old")
  def boom(*a, **k):
    raise OSError(28, "No space left on device")
  monkeypatch.setattr(os, "replace", boom)
  with pytest.raises(OSError):
    ffio.atomic_write_text(p, "new")
  assert p.read_text() == "old" and sorted(os.listdir(tmp_path)) == ["history.json"]


def test_json_lines_numbers_lines_and_names_the_bad_one(tmp_path):
  p = tmp_path / "rows.jsonl"
  p.write_text('{"a": 1}\n\n  \n{"a": 2}\n[1, 2]\n{"a": \n{"a": 3}\n')
  seen = []
  got = list(ffio.json_lines(p, on_error=seen.append))
  assert got == [(1, {"a": 1}), (4, {"a": 2}), (7, {"a": 3})]
  assert [(e.where, e.reason) for e in seen] == [
      (f"{p}:line 5", "expected a JSON object, got list"),
      (f"{p}:line 6", "invalid JSON (Expecting value at column 7)")]
  rows = ffio.json_lines(p)
  assert next(rows) == (1, {"a": 1}) and next(rows) == (4, {"a": 2})
  with pytest.raises(ffio.JsonLineError, match=rf"^{p}:line 5: expected a JSON object, got list$"):
    next(rows)


@pytest.mark.parametrize("text,reason", [('{"q": "x",}', r"invalid JSON \(Expecting property name enclosed in "
                                                          r"double quotes at column 11\)"),
                                         ('"just a string"', "expected a JSON object, got str")])
def test_every_jsonl_reader_names_the_file_and_line(tmp_path, text, reason):
  """The readers of training data, RL prompts, eval sets and retrieval corpora share `json_lines`."""
  from fineflax.data.rl_prompts import json_objects
  from fineflax.data.sources import DataError
  from fineflax.evals.harness import EvalDataError, load_eval_set
  from retrieval.jsonl_corpus import JsonlCorpus
  p = tmp_path / "set.jsonl"
  first = '{"question": "1 + 1?", "answer": "2"}\n'
  p.write_text(first + text + "\n")
  with pytest.raises(DataError, match=rf"^{p}:line 2: {reason}$"):
    list(json_objects(p))
  with pytest.raises(EvalDataError, match=rf"^{p}:line 2: {reason}$"):
    load_eval_set(p)
  corpus = JsonlCorpus(p)
  assert corpus[0]["answer"] == "2"
  with pytest.raises(ValueError, match=rf"^{p}: record 1 \(byte {len(first)}\): {reason}$"):
    corpus[1]
  corpus.close()
