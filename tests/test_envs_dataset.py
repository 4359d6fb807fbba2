"""The dataset environment: field maps of each public format, unusable rows named, epoch order and resume,
streaming reads, traces taken from their row, and checks that run before any weights load."""
from __future__ import annotations

import json
import types

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from fineflax.config_checks import ConfigError
from fineflax.data.rl_prompts import PromptRow, check_files, field_map, load_prompts
from fineflax.data.sources import DataError
from fineflax.rl.order import EpochOrder

SYSTEM = {"role": "system", "content": "Reason, then box the answer."}


def luffy_row(i, trace=True):
  row = {"data_source": "openr1", "prompt": [SYSTEM, {"role": "user", "content": f"What is {i} + {i}?"}],
         "ability": "math", "reward_model": {"ground_truth": str(2 * i), "style": "rule"},
         "extra_info": {"index": i, "split": "train"}}
  if trace:
    row["target"] = [{"role": "assistant", "content": f"<think>\n{i}+{i}</think>\n\\boxed{{{2 * i}}}"}]
  return row


def write_parquet(path, rows):
  pq.write_table(pa.Table.from_pylist(rows), path)
  return str(path)


def write_jsonl(path, rows):
  path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
  return str(path)


@pytest.mark.fast
def test_luffy_rows_map_to_prompts_with_their_traces(tmp_path):
  path = write_parquet(tmp_path / "openr1.parquet", [luffy_row(1), luffy_row(2)])
  rows = load_prompts(path, field_map("luffy"))
  assert len(rows) == 2 and rows.report()["without_target"] == 0
  assert rows[1] == PromptRow([SYSTEM, {"role": "user", "content": "What is 2 + 2?"}], "What is 2 + 2?", "4",
                              "openr1", "<think>\n2+2</think>\n\\boxed{4}", {}, f"{path}:row 1")
  assert rows[1].example() == {"ground_truth": "4", "data_source": "openr1"}


@pytest.mark.fast
@pytest.mark.parametrize("fmt,row,expected", [
    ("search_r1", {"id": "train_0", "question": "who wrote hamlet?", "golden_answers": ["Shakespeare", "W. S."],
                   "data_source": "nq", "prompt": [{"role": "user", "content": "Answer ... hamlet?"}],
                   "reward_model": {"ground_truth": {"target": ["Shakespeare", "W. S."]}, "style": "rule"}},
     ("who wrote hamlet?", ["Shakespeare", "W. S."], "nq")),
    ("gsm8k", {"question": "Ann has 3 bags of 4 apples. How many?", "answer": "3 * 4 = <<3*4=12>>12\n#### 1,012"},
     ("Ann has 3 bags of 4 apples. How many?", "1012", "openai/gsm8k")),
    ("math", {"problem": "Find $x$ if $2x=1$.", "solution": "So $x=\\boxed{\\frac{1}{2}}$.", "level": "Level 1",
              "type": "Algebra"}, ("Find $x$ if $2x=1$.", "\\frac{1}{2}", "lighteval/MATH")),
])
def test_text_formats(tmp_path, fmt, row, expected):
  path = write_jsonl(tmp_path / "d.jsonl", [row])
  (item,) = list(load_prompts(path, field_map(fmt)))
  assert (item.question, item.ground_truth, item.data_source, item.target) == (*expected, None)
  assert item.messages == row.get("prompt", [{"role": "user", "content": expected[0]}])


def test_custom_map_with_reward_kwargs(tmp_path):
  path = write_jsonl(tmp_path / "d.jsonl", [{"q": "2+2?", "meta": {"gt": 4, "src": "toy"}, "tests": ["a"]}])
  fm = field_map("custom", question="q", ground_truth="meta.gt", data_source="meta.src", reward_kwargs=("tests",))
  (item,) = list(load_prompts(path, fm))
  assert item.example() == {"ground_truth": "4", "data_source": "toy", "tests": ["a"]}
  with pytest.raises(ValueError, match="needs 'question'"):
    field_map("custom", ground_truth="a", source_name="x")
  with pytest.raises(ValueError, match="unknown field-map key"):
    field_map("luffy", answer="x")


@pytest.mark.fast
def test_unusable_rows_are_named_or_counted(tmp_path, caplog):
  bad_gt = luffy_row(2)
  del bad_gt["reward_model"]["ground_truth"]
  bad_prompt = luffy_row(3)
  bad_prompt["prompt"] = [SYSTEM]  # no user turn
  path = write_parquet(tmp_path / "p.parquet", [luffy_row(1), bad_gt, bad_prompt, luffy_row(4, trace=False)])
  with pytest.raises(DataError, match=r"p\.parquet:row 1: field 'reward_model.ground_truth': missing"):
    load_prompts(path, field_map("luffy"))
  rows = load_prompts(path, field_map("luffy"), on_bad_row="skip")
  assert len(rows) == 2 and rows.num_skipped == 2 and rows.report()["without_target"] == 1
  assert "row 2: field 'prompt'" in rows.skipped[1] and "skipped 2 unusable row(s) of 4" in caplog.text
  assert [r.where.rsplit(":", 1)[1] for r in rows] == ["row 0", "row 3"]
  # JSON lines are named by line (blank lines hold no row)
  jl = write_jsonl(tmp_path / "g.jsonl", [{"question": "a?", "answer": "x\n#### 1"}, "",
                                         {"question": "b?", "answer": "no hashes"}])
  with pytest.raises(DataError, match=r"g\.jsonl:line 3: field 'answer': no '#### answer' line"):
    load_prompts(jl, field_map("gsm8k"))
  broken = write_jsonl(tmp_path / "b.jsonl", [{"question": "a?", "answer": "#### 1"}, "{oops"])
  with pytest.raises(DataError, match=r"b\.jsonl:line 2: invalid JSON"):
    load_prompts(broken, field_map("gsm8k"))


def test_check_files_reads_only_the_head(tmp_path):
  good = write_parquet(tmp_path / "g.parquet", [luffy_row(1)])
  check_files(good, field_map("luffy"))
  with pytest.raises(DataError, match=r"no column\(s\) \['reward_model'\]"):
    check_files(write_parquet(tmp_path / "n.parquet", [{"prompt": [SYSTEM], "data_source": "x"}]),
                field_map("luffy"))
  with pytest.raises(DataError, match=r"h\.jsonl:line 2: field 'answer'"):
    check_files(write_jsonl(tmp_path / "h.jsonl", ["", {"question": "q", "answer": ""}]), field_map("gsm8k"))
  with pytest.raises(FileNotFoundError, match="nope"):
    check_files(str(tmp_path / "nope*.parquet"), field_map("luffy"))


@pytest.mark.fast
def test_epoch_order_is_a_function_of_the_position():
  order = EpochOrder(10, seed=3, reshuffle=True)
  epochs = [[order[k] for k in range(e * 10, (e + 1) * 10)] for e in range(3)]
  assert all(sorted(e) == list(range(10)) for e in epochs) and epochs[0] != epochs[1] != epochs[2]
  assert epochs[0] == np.random.default_rng(3).permutation(10).tolist()  # epoch 0: the job's old order
  resumed = EpochOrder(10, seed=3, reshuffle=True)  # a restarted run: same questions at the same positions
  assert [resumed[k] for k in (25, 3, 17)] == [epochs[2][5], epochs[0][3], epochs[1][7]]
  fixed = EpochOrder(10, seed=3)
  assert [fixed[k] for k in range(10, 20)] == epochs[0]


def test_streaming_reads_every_row_once_an_epoch(tmp_path):
  rows = [luffy_row(i) for i in range(12)]
  rows[5]["reward_model"]["ground_truth"] = ""
  path = write_parquet(tmp_path / "s.parquet", rows)
  fm = field_map("luffy")
  stream = load_prompts(path, fm, streaming=True, on_bad_row="skip", seed=1, buffer_size=4)
  assert len(stream) == 11 and stream.num_skipped == 1 and "row 5" in stream.skipped[0]
  epoch0 = [stream[k].ground_truth for k in range(11)]
  epoch1 = [stream[k].ground_truth for k in range(11, 22)]
  want = sorted(str(2 * i) for i in range(12) if i != 5)
  assert sorted(epoch0) == sorted(epoch1) == want and epoch0 != epoch1
  again = load_prompts(path, fm, streaming=True, on_bad_row="skip", seed=1, buffer_size=4)
  assert again[13].ground_truth == epoch1[2] and again[4].ground_truth == epoch0[4]  # backwards: re-read


class _Tok:
  """A stand-in tokenizer: one id per character, a trivial chat template."""

  def __call__(self, text, add_special_tokens=False):
    return {"input_ids": [ord(c) for c in text]}

  def apply_chat_template(self, messages, **kw):
    return "".join(f"<{m['role']}>{m['content']}" for m in messages) + "<assistant>"


def _env_config(train, eval_="", **dataset):
  from configs import dataset_rl
  config = dataset_rl.get_config("smoke")
  config.dataset.update(train=train, eval=eval_, **dataset)
  return config


def test_demonstrations_come_from_the_row(tmp_path, monkeypatch):
  from fineflax.envs import dataset as env_lib
  from fineflax.rl.collect import rollout_groups
  from fineflax.rl.guidance import Guidance
  monkeypatch.setattr(env_lib, "chat_prompt_ids",
                      lambda tok, messages, prefix="": tok(tok.apply_chat_template(messages) + prefix)["input_ids"])
  path = write_parquet(tmp_path / "t.parquet", [luffy_row(1), luffy_row(2, trace=False)])
  env = env_lib.DatasetEnv(_env_config(path, assistant_prefix="<think>\n"), _Tok())
  policy = types.SimpleNamespace(eos_id=0, max_new_tokens=1000)
  with_trace, without = env.demonstrations(policy, [env.train_items[0], env.train_items[1]])
  assert without is None
  row, example = with_trace
  assert row["text"] == ["<think>\n1+1</think>\n\\boxed{2}"] and example["ground_truth"] == "2"
  assert row["completion"][0] == [ord(c) for c in "1+1</think>\n\\boxed{2}"] + [0]  # prefix is in the prompt
  assert row["prompt"][0][-len("<assistant><think>\n"):] == [ord(c) for c in "<assistant><think>\n"]

  def rollout(policy_, items, rng, mask_truncated=False):
    from fineflax.rl import rows as R
    return (R.make_rows([[1]] * len(items), [[2]] * len(items), [[1.0]] * len(items), ["x"] * len(items),
                        off_policy=False), [env.example(p) for p in items])
  monkeypatch.setattr(env, "rollout", rollout)
  rows, examples = rollout_groups(env, policy, [env.train_items[0], env.train_items[1]], [None, None], None,
                                  group_size=4, guidance=Guidance(1))
  assert rows["off_policy"] == [False] * 3 + [True] + [False] * 4  # the row without a trace: 4 samples
  assert examples[3]["ground_truth"] == "2"


def test_validate_runs_before_weights(tmp_path):
  from fineflax.envs.dataset import DatasetEnv
  good = write_parquet(tmp_path / "g.parquet", [luffy_row(1)])
  DatasetEnv.validate(_env_config(good, good))
  with pytest.raises(FileNotFoundError, match="missing.parquet"):
    DatasetEnv.validate(_env_config(str(tmp_path / "missing.parquet")))
  with pytest.raises(ConfigError, match="dataset.on_bad_row"):
    DatasetEnv.validate(_env_config(good, on_bad_row="ignore"))
  with pytest.raises(ConfigError, match="dataset: format='alpaca'"):
    DatasetEnv.validate(_env_config(good, format="alpaca"))
  with pytest.raises(ConfigError, match="eval_temperature"):
    DatasetEnv.validate(_env_config(good, eval_n=4))
  bad = write_parquet(tmp_path / "b.parquet", [dict(luffy_row(1), prompt="not messages")])
  with pytest.raises(DataError, match=r"b\.parquet:row 0: field 'prompt'"):
    DatasetEnv.validate(_env_config(bad))


def _make_samples():
  import importlib.util
  from fineflax.data.sources import SAMPLES_DIR
  spec = importlib.util.spec_from_file_location("make_samples", SAMPLES_DIR / "make_samples.py")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def test_rl_samples_match_their_generator():
  from fineflax.data.sources import sample_file
  for name, content in _make_samples().build_rl_samples().items():
    if isinstance(content, str):
      assert sample_file(name).read_text() == content, f"{name} differs from make_samples.py output"
    else:
      assert pq.read_table(sample_file(name)).to_pylist() == content, f"{name} differs from make_samples.py"


@pytest.mark.parametrize("name,fmt,count,first", [
    ("luffy_openr1.parquet", "luffy", 8, ("What is the sum of the first 10 positive odd integers?", "100", "openr1")),
    ("luffy_valid.parquet", "luffy", 10, ("Find the number of ordered pairs of positive integers $(a, b)$ with "
                                          "$a + b = 20$.", "19", "aime")),
    ("search_r1_train.parquet", "search_r1", 6, ("what is the capital of varnholm", ["Ostmar"], "nq")),
    ("search_r1_test.parquet", "search_r1", 6, ("who discovered the comet sul-3", ["Lena Sul"], "nq")),
    ("gsm8k_test.jsonl", "gsm8k", 8, None),
    ("math_test.jsonl", "math", 6, None),
])
def test_samples_load_to_the_expected_items(name, fmt, count, first):
  rows = load_prompts(f"sample:{name}", field_map(fmt))
  assert len(rows) == count and rows.num_skipped == 0
  if first is not None:
    assert (rows[0].question, rows[0].ground_truth, rows[0].data_source) == first
  if fmt == "luffy":
    assert rows[0].messages[0]["role"] == "system" and rows[0].messages[-1]["content"] == first[0]
    assert (rows.report()["without_target"] == 0) == ("openr1" in name)


def test_gsm8k_and_math_samples_keep_the_final_answer():
  import re
  from fineflax.data.sources import sample_file
  gsm = [json.loads(line) for line in sample_file("gsm8k_test.jsonl").read_text().splitlines()]
  rows = load_prompts("sample:gsm8k_test.jsonl", field_map("gsm8k"))
  for raw, row in zip(gsm, rows):  # the answer after "####" is the arithmetic of the question's numbers
    boxes, per, extra = map(int, re.findall(r"\d+", raw["question"])[:3])
    assert row.ground_truth == str(boxes * per + extra) and row.data_source == "openai/gsm8k"
  from fractions import Fraction
  from math_verify import parse, verify
  for row in load_prompts("sample:math_test.jsonl", field_map("math")):
    a, b, c = map(int, re.findall(r"\d+", row.question))
    x = Fraction(c - b, a)
    assert verify(parse("$" + row.ground_truth + "$"), parse(f"${x.numerator}/{x.denominator}$"))


def test_sample_traces_earn_the_luffy_reward():
  from fineflax.rewards import get_reward
  rows = load_prompts("sample:luffy_openr1.parquet", field_map("luffy"))
  assert [get_reward("math_think")(r.question, r.target[len("<think>\n"):], **r.example()) for r in rows] == [1.0] * 8
  assert get_reward("math_think")("", "no closing tag \\boxed{100}", **rows[0].example()) == 0.0


@pytest.mark.long
def test_luffy_config_runs_two_steps_from_the_sample_with_traces(tiny_smol, tmp_path):
  from fineflax.jobs import rl as rl_job
  from fineflax.jobs.resolve import load_config, validate
  config = load_config("configs/dataset_rl.py:luffy,smoke", [f"model.source={tiny_smol}"])
  validate(config)
  assert (config.dataset.train, config.rl.objective, config.rl.luffy.n_off) == ("sample:luffy_openr1.parquet",
                                                                                "luffy", 1)
  out = rl_job.run(config, str(tmp_path))
  assert [h["step"] for h in out["history"]] == [1, 2] and out["exit_code"] == 0
  for h in out["history"]:  # each group of 4 held one trace row: the off-policy loss term is there
    assert h["off_policy_prob"] > 0 and h["off_pg_loss"] != 0
  assert "eval_accuracy" in out["history"][-1] and "eval_accuracy_aime" in out["history"][-1]
