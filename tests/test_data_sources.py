"""Sources: file formats through `datasets`, bad rows (error naming file+line, or skip and count), empty
files, missing columns, tfds without tensorflow-datasets, and the bundled samples."""
import importlib.util
import json

import pytest

from fineflax.data import DataError, load_source, sample_file
from fineflax.data.sources import SAMPLES_DIR

MSG = lambda q, a: {"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": a}]}


def write_jsonl(path, lines):
  path.write_text("".join((l if isinstance(l, str) else json.dumps(l)) + "\n" for l in lines))
  return path


@pytest.mark.fast
def test_jsonl_invalid_json_names_file_and_line(tmp_path):
  lines = [MSG("a", "1"), "", MSG("b", "2"), '{"messages": [', MSG("c", "3")]
  path = write_jsonl(tmp_path / "chat.jsonl", lines)
  with pytest.raises(DataError, match=rf"{path}:line 4: invalid JSON"):
    load_source(path)


def test_jsonl_schema_error_names_line_and_field(tmp_path):
  bad = {"messages": [{"role": "user", "content": "x"}, {"role": "assistant"}]}
  path = write_jsonl(tmp_path / "chat.jsonl", [MSG("a", "1"), bad])
  with pytest.raises(DataError, match=rf"{path}:line 2: messages\[1\]: missing 'content'"):
    load_source(path)


def test_jsonl_skip_mode_counts_and_keeps_line_numbers(tmp_path):
  lines = [MSG("a", "1"), "not json", MSG("b", "2"), {"messages": "oops"}, "", MSG("c", "3")]
  src = load_source(write_jsonl(tmp_path / "chat.jsonl", lines), on_bad_row="skip")
  assert len(src) == 3 and src.num_skipped == 2
  assert ":line 2:" in src.skipped[0] and ":line 4:" in src.skipped[1]
  assert [src[i]["messages"][0]["content"] for i in range(3)] == ["a", "b", "c"]
  assert [src[i]["where"].rsplit(":", 1)[1] for i in range(3)] == ["line 1", "line 3", "line 6"]


def test_invalid_json_message_says_at_once(tmp_path):
  """json's "Invalid control character at" already ends with "at": no "at at column" (issue 20)."""
  path = tmp_path / "chat.jsonl"
  path.write_text(json.dumps(MSG("a", "1")) + "\n" + '{"messages": [{"role": "user", "content": "x\ty"}]}\n')
  with pytest.raises(DataError) as err:
    load_source(path)
  assert str(err.value) == f"{path}:line 2: invalid JSON (Invalid control character at column 45)"
  write_jsonl(path, [MSG("a", "1"), '{"messages": ]'])
  with pytest.raises(DataError, match=r"line 2: invalid JSON \(Expecting value at column 14\)$"):
    load_source(path)


def test_skipped_rows_are_reported_on_the_console_and_in_a_dict(tmp_path, caplog):
  lines = [MSG("a", "1"), "not json", MSG("b", "2"), {"messages": "oops"}] + ["{"] * 6 + [MSG("c", "3")]
  path = write_jsonl(tmp_path / "chat.jsonl", lines)
  with caplog.at_level("WARNING", logger="fineflax.data"):
    src = load_source(path, on_bad_row="skip")
  report = src.skip_report()
  assert report["skipped"] == 8 and len(report["skipped_first"]) == 5
  assert [r.split(":")[1] for r in report["skipped_first"]] == ["line 2", "line 4", "line 5", "line 6",
                                                                   "line 7"]
  [record] = [r for r in caplog.records if r.name == "fineflax.data"]
  msg = record.getMessage()
  assert msg.startswith(f"{path}: skipped 8 malformed row(s) of 11 (on_bad_row='skip'): "
                        "line 2, line 4, line 5, line 6, line 7 and 3 more; first: ")
  assert "line 2: invalid JSON (Expecting value at column 1)" in msg
  caplog.clear()
  with caplog.at_level("WARNING", logger="fineflax.data"):
    assert load_source(write_jsonl(tmp_path / "ok.jsonl", [MSG("a", "1")]), on_bad_row="skip").num_skipped == 0
  assert not caplog.records


def test_csv_bad_record_names_its_line_after_a_multiline_cell(tmp_path):
  path = tmp_path / "pc.csv"
  path.write_text('prompt,completion\n"two\nlines",A\nQ2,A2,extra\nQ3,007\n')
  with pytest.raises(DataError, match=rf"{path}:line 4: expected 2 fields"):
    load_source(path)
  src = load_source(path, on_bad_row="skip")
  assert src.num_skipped == 1 and len(src) == 2
  # cells stay text: "007" is not read as the number 7
  assert src[1]["messages"] == [{"role": "user", "content": "Q3"}, {"role": "assistant", "content": "007"}]
  assert src[1]["where"].endswith("line 5")


def test_json_array_and_parquet(tmp_path):
  import pandas as pd
  conv = {"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "hello"}]}
  (tmp_path / "sg.json").write_text(json.dumps([conv, {"conversations": [{"from": "human", "value": "x"}]}]))
  with pytest.raises(DataError, match=r"sg\.json:row 1: conversations: no assistant turn"):
    load_source(tmp_path / "sg.json")
  src = load_source(tmp_path / "sg.json", on_bad_row="skip")
  assert src.schema == "sharegpt" and len(src) == 1 and src.num_skipped == 1
  pd.DataFrame({"instruction": ["Add.", "Sub."], "input": ["1 2", ""], "output": ["3", "x"]}).to_parquet(
      tmp_path / "a.parquet")
  src = load_source(tmp_path / "a.parquet")
  assert src.schema == "alpaca" and src[1]["messages"][0] == {"role": "user", "content": "Sub."}


def test_tool_call_arguments_survive_arrow_struct_unification(tmp_path):
  call = lambda name, args: {"messages": [{"role": "user", "content": "q"}, {
      "role": "assistant", "content": "", "tool_calls": [{"type": "function",
                                                          "function": {"name": name, "arguments": args}}]}]}
  src = load_source(write_jsonl(tmp_path / "t.jsonl", [call("f", {"city": "X"}), call("g", {"n": 3})]))
  got = [json.loads(src[i]["messages"][1]["tool_calls"][0]["function"]["arguments"]) for i in range(2)]
  assert got == [{"city": "X"}, {"n": 3}]


def test_empty_datasets(tmp_path):
  (tmp_path / "e.jsonl").write_text("")
  (tmp_path / "blank.jsonl").write_text("\n  \n")
  (tmp_path / "h.csv").write_text("prompt,completion\n")
  for name in ("e.jsonl", "blank.jsonl", "h.csv"):
    with pytest.raises(DataError, match=rf"{name}: dataset is empty"):
      load_source(tmp_path / name)
  with pytest.raises(DataError, match=r"<memory>: dataset is empty"):
    load_source([])
  path = write_jsonl(tmp_path / "allbad.jsonl", ["x", "y"])
  with pytest.raises(DataError, match=r"allbad\.jsonl: dataset is empty \(no valid rows; 2 skipped\)"):
    load_source(path, on_bad_row="skip")


@pytest.mark.fast
def test_missing_columns(tmp_path):
  path = write_jsonl(tmp_path / "a.jsonl", [{"instruction": "Add.", "answer": "3"}])
  with pytest.raises(DataError, match=rf"{path}:line 1: missing column\(s\) \['output'\] of schema 'alpaca'"):
    load_source(path, schema="alpaca")
  with pytest.raises(DataError, match=rf"{path}:line 1: cannot detect the schema.*'answer'"):
    load_source(path)
  (tmp_path / "p.csv").write_text("prompt,answer\nQ,A\n")
  with pytest.raises(DataError, match=r"p\.csv: schema 'prompt_completion' needs column\(s\) \['compl"):
    load_source(tmp_path / "p.csv", schema="prompt_completion")
  with pytest.raises(FileNotFoundError, match="nope.jsonl"):
    load_source(tmp_path / "nope.jsonl")


def test_unknown_file_type_and_unreachable_hub_name(tmp_path):
  (tmp_path / "notes.txt").write_text("hello")
  with pytest.raises(DataError, match=r"notes\.txt: unknown file type '\.txt'"):
    load_source(str(tmp_path / "notes.txt"))
  with pytest.raises(DataError, match=r"no-such-org/no-such-set: not a local file .*load_dataset failed"):
    load_source("no-such-org/no-such-set")  # conftest sets HF_HUB_OFFLINE=1


@pytest.mark.skipif(importlib.util.find_spec("tensorflow_datasets") is not None,
                    reason="tensorflow-datasets is installed")
def test_tfds_without_tensorflow_datasets_is_a_clear_error():
  with pytest.raises(ImportError, match="tfds:mnist: tfds sources need tensorflow-datasets"):
    load_source("tfds:mnist")


@pytest.mark.fast
def test_bundled_samples_match_their_generator_and_load():
  spec = importlib.util.spec_from_file_location("make_samples", SAMPLES_DIR / "make_samples.py")
  make_samples = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(make_samples)
  built = make_samples.build_samples()
  assert sum(len(t.encode()) for t in built.values()) < 1_000_000
  expected = {"arithmetic_messages.jsonl": "messages", "arithmetic_eval_messages.jsonl": "messages",
              "units_sharegpt.json": "sharegpt",
              "world_alpaca.jsonl": "alpaca", "strings_prompt_completion.csv": "prompt_completion",
              "tools_glaive.jsonl": "glaive"}
  assert set(built) == set(expected)
  for name, text in built.items():
    assert sample_file(name).read_text() == text, f"{name} differs from make_samples.py output"
    src = load_source(sample_file(name))
    assert src.schema == expected[name] and src.num_skipped == 0
    assert len(src) >= (64 if "eval" in name else 200)


def test_loading_prints_no_datasets_progress_bars(tmp_path, capfd):
  import datasets
  path = write_jsonl(tmp_path / "quiet.jsonl", [MSG("a", "1"), MSG("b", "2")])
  load_source(path)
  assert "Generating train split" not in capfd.readouterr().err
  assert not datasets.are_progress_bars_disabled()  # the global setting is restored
