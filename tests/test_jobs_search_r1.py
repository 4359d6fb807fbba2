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


def test_search_r1_runs_async_with_tis_by_default(tiny_smol, tmp_path):
  """Multi-turn Search-R1 rows (tool observations masked out) under rl.async_steps=1: step 2 trains on the
  batch made with version 0's weights, and the default importance (auto = tis) bounds its weights by C."""
  c = load_config("configs/search_r1.py:smoke", [f"model.source={tiny_smol}", "num_steps=2", "eval_every=2",
                                                 "lora.targets=('q','v')", "rl.async_steps=1",
                                                 # rewards are 0 for a random model: the entropy bonus moves it
                                                 "rl.entropy_coef=0.5", "optimizer.learning_rate=0.05",
                                                 "optimizer.warmup_steps=0"])
  hist = [h for h in rl_job.run(c, str(tmp_path))["history"] if h["step"] > 0]
  assert [h["policy_version"] for h in hist] == [0, 0] and [h["staleness"] for h in hist] == [0, 1]
  assert hist[0]["mismatch_max_abs_dlogp"] < 1e-3 < hist[1]["mismatch_max_abs_dlogp"]  # stale: the weights moved
  assert all(h["is_weight_max"] <= c.rl.importance_cap + 1e-6 for h in hist)
  assert {"searches", "eval_em"} <= set(hist[-1])
