"""The RL job on the Search-R1 env, tiny model: rollouts with real BM25 search, LUFFY demonstrations
(the "combined" mode), an update, evaluation."""
import os

import pytest

from fineflax.jobs import rl as rl_job
from fineflax.jobs.resolve import load_config


def test_search_r1_job_runs_one_step_with_luffy_demonstrations(tiny_smol, tmp_path):
  # adapters on q and v, as the Search-R1 experiment smoke (test_experiments_papers.py) trains them: this
  # run's programs are its "combined" method's, read from the run's persistent compilation cache
  c = load_config("configs/search_r1.py:smoke", [f"model.source={tiny_smol}", "eval_at_start=True",
                                                 "lora.targets=('q','v')"])
  assert c.rl.objective == "luffy" and "exgrpo" not in c.rl  # no fields it does not use
  out = rl_job.run(c, str(tmp_path))
  hist = out["history"]
  assert [h["step"] for h in hist] == [0, 1]
  assert {"eval_em", "eval_em_1hop", "eval_em_2hop", "eval_searches"} <= set(hist[-1])
  assert {"loss", "searches", "off_policy_prob", "reward_search_r1_em"} <= set(hist[-1])
  assert os.path.exists(tmp_path / "adapter" / "adapter_model.safetensors")
  assert os.path.exists(tmp_path / "history.json") and os.path.exists(tmp_path / "summary.json")


@pytest.mark.fast
def test_info_masking_ablation_trains_on_inserted_tokens():
  from fineflax.envs.search_r1 import result_rows
  from fineflax.search_r1 import RolloutResult
  r = RolloutResult()
  r._add([5, 6], 1.0, [-0.1, -0.2], "<search>q</search>")
  r._add([7, 8, 9], 0.0, [0.0] * 3, "<information>doc</information>")
  r._add([10], 1.0, [-0.3], "<answer>a</answer>")
  r.finish = "answer"
  assert result_rows([[1, 2]], [r], False)["loss_mask"] == [[1.0, 1.0, 0.0, 0.0, 0.0, 1.0]]
  assert result_rows([[1, 2]], [r], False, mask_info=False)["loss_mask"] == [[1.0] * 6]
  assert result_rows([[1, 2]], [r], False)["rollout_logp"] == [[-0.1, -0.2, 0.0, 0.0, 0.0, -0.3]]
