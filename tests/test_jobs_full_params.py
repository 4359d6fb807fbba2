"""config.train.params="full" through the jobs on a tiny model: SFT, RL (grpo with beta > 0, so the frozen
reference copy is used) and distillation (in micro-batches) each run and export a merged Hugging Face folder
of the trained weights; full training of an NF4 base is refused by launch.py in one line (exit 2)."""
import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest

from fineflax.jobs.resolve import load_config
from fineflax.models import load

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FULL = {"model.quant": "none", "train.params": "full"}


def _changed_from(source, exported: str) -> float:
  """The largest |trained - initial| over the weights of the exported HF folder (which must load)."""
  new, mc_new, tok = load(exported)
  old, mc_old, _ = load(source, with_tokenizer=False)
  assert mc_new.num_layers == mc_old.num_layers and tok is not None
  assert jax.tree.structure(new) == jax.tree.structure(old)
  return max(float(np.abs(np.asarray(a, np.float32) - np.asarray(b, np.float32)).max())
             for a, b in zip(jax.tree.leaves(new), jax.tree.leaves(old)))


@pytest.mark.long
def test_full_sft_job_trains_every_weight_and_exports_a_merged_model(tiny_smol, tmp_path):
  from fineflax.jobs import sft
  over = {**FULL, "model.source": tiny_smol, "optimizer.num_steps": 2, "optimizer.warmup_steps": 0,
          "optimizer.learning_rate": 1e-3, "data.batch_size": 4, "data.max_length": 64, "data.eval_batches": 1,
          "eval_every": 2, "log_every": 1, "checkpoint.every": 2, "sample_prompt": ""}
  summary = sft.run(load_config("configs/quickstart.py", [f"{k}={v}" for k, v in over.items()]), str(tmp_path))
  assert summary["status"] == "completed" and "adapter" not in summary
  assert summary["model"] == os.path.join(str(tmp_path), "model")
  assert np.isfinite(summary["final_metrics"]["train_loss"]) and np.isfinite(summary["final_metrics"]["eval_loss"])
  assert _changed_from(tiny_smol, summary["model"]) > 1e-4  # bf16 master params moved


@pytest.mark.long
def test_full_grpo_job_with_a_kl_to_the_frozen_initial_params(tiny_smol, tmp_path):
  from fineflax.jobs import rl as rl_job
  over = {**FULL, "model.source": tiny_smol, "rl.max_new_tokens": 8, "task.num_eval": 4, "task.num_train": 64,
          "eval_batch_size": 4, "rl.beta": 0.04, "train.master_dtype": "float32",
          "optimizer.learning_rate": 1e-3, "optimizer.warmup_steps": 0,
          # a gradient whatever the rewards (a tiny random model solves nothing): the entropy bonus over
          # completions kept in the loss although cut at max_new_tokens
          "rl.entropy_coef": 0.01, "rl.mask_truncated": False}
  out = rl_job.run(load_config("configs/grpo_arith.py:smoke", [f"{k}={v}" for k, v in over.items()]),
                   str(tmp_path))
  assert out["exit_code"] == 0 and out["job"].learner.base is None
  kls = [h["kl"] for h in out["history"] if "kl" in h]
  # step 1 samples from and updates the initial params (KL 0 to them); step 2 starts from the moved ones:
  # a KL > 0 shows the reference stayed the frozen copy
  assert len(kls) == 2 and abs(kls[0]) < 1e-6 and kls[1] > 1e-7, kls
  assert _changed_from(tiny_smol, out["summary"]["model"]) > 1e-5


@pytest.mark.long
def test_full_distill_job_exports_the_trained_student(tiny_smol, tmp_path):
  from fineflax import lora as lora_lib
  from fineflax.jobs import distill
  params, mc, _ = load(tiny_smol)  # teacher: the student's initial weights + a random adapter
  cfg = lora_lib.LoraConfig(r=8, alpha=16.0, target_modules=("q", "v", "up"))
  t_lora = lora_lib.init_lora(params, mc, cfg, jax.random.PRNGKey(3))
  t_lora = jax.tree.map(lambda x: x + 0.3 * jax.random.normal(jax.random.PRNGKey(4), x.shape), t_lora)
  lora_lib.export_peft(t_lora, cfg, mc, tmp_path / "teacher")
  over = {**FULL, "model.source": tiny_smol, "teacher.adapter": str(tmp_path / "teacher"), "teacher.source": "",
          "teacher.max_new_tokens": 8, "task.num_eval": 4, "eval_batch_size": 4, "task.eval_max_new_tokens": 4,
          "num_steps": 2, "eval_every": 2, "distill.prompts_per_step": 4, "distill.top_k": 16,
          "optimizer.learning_rate": 1e-3, "optimizer.warmup_steps": 0, "teacher.temperature": 0.0,
          "distill.only_correct": False, "task.num_train": 4,
          "train.micro_batch_tokens": 256}  # micro-batches of a few padded rows, gradients accumulated
  summary = distill.run(load_config("configs/distill.py:cpu", [f"{k}={v}" for k, v in over.items()]),
                        str(tmp_path / "run"))
  history = json.loads((tmp_path / "run" / "history.json").read_text())
  kls = [h["kl"] for h in history if "kl" in h]
  assert len(kls) == 2 and kls[1] < kls[0], kls  # the same 4 questions: the student moves to the teacher
  assert all(h["micro_batches"] >= 2 for h in history if "kl" in h), history
  assert _changed_from(tiny_smol, summary["model"]) > 1e-4


@pytest.mark.long
def test_launch_refuses_full_training_of_an_nf4_base_in_one_line():
  r = subprocess.run([sys.executable, os.path.join(ROOT, "launch.py"), "--config", "configs/quickstart.py",
                      "--config.train.params=full", "--dry_run"], cwd=ROOT, capture_output=True, text=True,
                     timeout=120)
  assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
  assert r.stderr.startswith("error: config.model.quant='nf4': config.train.params='full'"), r.stderr
