"""The distillation job end to end on a tiny model: the student's KL to a teacher (base + another adapter)
falls, the teacher is untouched, accuracies and the PEFT adapter are written."""
import json
import os

import jax
import numpy as np
import pytest

from fineflax.jobs.resolve import load_config
from fineflax import lora as lora_lib
from fineflax.models import load


@pytest.mark.long  # ~55 s of CPU: jit of generate (teacher, student) and of the step
def test_distill_job_kl_falls_and_exports(tiny_smol, tmp_path):
  from fineflax.jobs import distill
  # a teacher adapter: random (nonzero B) rank-8 LoRA on the same base, exported as PEFT
  params, mc, _ = load(tiny_smol)
  cfg = lora_lib.LoraConfig(r=8, alpha=16.0, target_modules=("q", "v", "up"))
  t_lora = lora_lib.init_lora(params, mc, cfg, jax.random.PRNGKey(3))
  t_lora = jax.tree.map(lambda x: x + 0.3 * jax.random.normal(jax.random.PRNGKey(4), x.shape), t_lora)
  lora_lib.export_peft(t_lora, cfg, mc, tmp_path / "teacher")
  over = {"model.source": tiny_smol, "teacher.adapter": str(tmp_path / "teacher"),
          "teacher.max_new_tokens": 8, "task.num_eval": 4, "eval_batch_size": 4,
          "task.eval_max_new_tokens": 4, "num_steps": 4, "eval_every": 4, "distill.prompts_per_step": 4,
          "distill.top_k": 16, "optimizer.learning_rate": 3e-2, "optimizer.warmup_steps": 0,
          "teacher.temperature": 0.0, "teacher.source": "", "distill.only_correct": False,
          "task.num_train": 4}  # the same 4 questions every step: the KL must fall
  c = load_config("configs/distill.py:cpu", [f"{k}={v}" for k, v in over.items()])
  summary = distill.run(c, str(tmp_path / "run"))
  history = json.loads((tmp_path / "run" / "history.json").read_text())
  kls = [h["kl"] for h in history if "kl" in h]
  assert len(kls) == 4 and kls[-1] < 0.8 * kls[0], kls
  assert all(0 <= summary[k] <= 1 for k in ("teacher_eval_accuracy", "student_before", "student_after"))
  student, s_cfg = lora_lib.import_peft(summary["adapter"], mc)
  assert s_cfg.r == 4 and float(np.abs(np.asarray(student["q"]["b"])).max()) > 0
  assert json.loads((tmp_path / "run" / "summary.json").read_text())["num_eval"] == 4
  assert os.path.exists(tmp_path / "run" / "logs")


@pytest.mark.fast
def test_a_teacher_of_another_vocabulary_is_refused(tmp_path):
  import types

  import jax.numpy as jnp

  from fineflax.jobs import distill
  from fineflax.testing.hf_models import make_hf_model
  make_hf_model("llama", tmp_path / "teacher", vocab_size=96)
  c = load_config("configs/distill.py:cpu", [f"teacher.source={tmp_path / 'teacher'}"])
  with pytest.raises(ValueError, match=r"config.teacher.source=.*: vocabulary 96 != the student's 160"):
    distill.setup_teacher(c, None, types.SimpleNamespace(vocab_size=160), jnp.float32)
