"""benchmarks/rl.py's shared pieces: the frameworks see the same token ids and rewards, the phases and the
ratios of the report are the ones claimed."""
import pytest

from benchmarks import _rl_common as C
from benchmarks import rl

pytestmark = pytest.mark.fast


def test_word_tokenizer_round_trips_ids_and_rewards_agree():
  pytest.importorskip("tokenizers")
  tok = C.word_tokenizer(300)
  ids = [5, 299, 2, 17]
  assert tok(C.text_of(ids)).input_ids == ids  # TRL / tunix read the prompt ids fineflax samples from
  assert (tok.eos_token_id, tok.pad_token_id) == (C.EOS_ID, C.PAD_ID)
  text = tok.decode(ids)
  assert C.reward_of_text(text) == C.reward_of_tokens(ids)  # same reward from decoded text as from ids
  assert C.reward_of_tokens(ids) != C.reward_of_tokens(ids[::-1])


def test_summarize_keeps_first_step_apart_and_takes_the_fastest_timed_step():
  split = C.Split()
  for rollout, update in ((30.0, 50.0), (2.0, 1.5), (1.0, 1.0)):
    split.new_step()
    split.add("rollout", rollout)
    split.add("update", update)
  res = C.summarize(split, warmup=1)
  assert res["first"]["step"] == 80.0
  assert res["timed"] == {"rollout": 1.0, "update": 1.0, "step": 2.0}
  assert res["timed_mean"]["step"] == pytest.approx(2.75)
  assert res["timed_steps"] == 2


def _row(framework, step, rollout, model="m"):
  return {"model": model, "framework": framework, "prompts": 2, "group": 2, "new_tokens": 4, "prompt_len": 3,
          "warmup": 1, "steps": 2, "settings": "s", "versions": {framework: "1"},
          "timed": {"step": step, "rollout": rollout, "generate": rollout, "update": step - rollout},
          "first": {"step": 9.0, "rollout": 4.0, "update": 5.0}, "setup_s": 1.0, "peak_bytes": None}


def test_report_ratios_are_their_step_over_fineflax_and_mark_targets():
  rows = [_row("fineflax", 2.0, 1.0), _row("trl", 5.0, 4.0), _row("tunix", 1.0, 0.5),
          dict(_row("tunix", 0, 0, model="n"), error="not run: ImportError: tunix")]
  md = rl.report(rows, "gpu", "python -m benchmarks.rl", smoke=False)
  assert "fineflax 2.00 s vs trl 5.00 s per step = **2.50x** (target >= 3x: missed)" in md
  assert "rollout 4.00x, update 1.00x" in md
  assert "fineflax 2.00 s vs tunix 1.00 s per step = **0.50x** (target >= 1x: missed)" in md
  assert "| n | tunix | not run: ImportError: tunix |" in md
