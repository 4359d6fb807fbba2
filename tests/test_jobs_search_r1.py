"""The Search-R1 job end to end on a tiny model: rollouts with real BM25 search, an update, evaluation."""
import os

from experiments.common import load_config
from fineflax.jobs import search_r1


def test_search_r1_job_runs_one_step(tiny_smol, tmp_path):
  c = load_config("configs/search_r1.py", "smoke")
  c.model.source = tiny_smol
  c.num_steps = 1
  c.eval_at_start = True
  out = search_r1.run(c, str(tmp_path))
  hist = out["history"]
  assert [h["step"] for h in hist] == [0, 1]
  assert {"eval_em", "eval_em_1hop", "eval_em_2hop", "eval_searches"} <= set(hist[-1])
  assert "loss" in hist[-1] and "searches" in hist[-1]
  assert os.path.exists(tmp_path / "adapter" / "adapter_model.safetensors")
  assert os.path.exists(tmp_path / "history.json")
