"""`--dry_run` names the mesh it would build and the memory estimate (an RL job: its plan) per device."""
import pytest

from fineflax.config_checks import ConfigError
from fineflax.jobs import dry_run_report, per_device_gib, plan_for
from fineflax.jobs.resolve import load_config


def test_dry_run_prints_the_mesh_and_per_device_memory(tiny_smol):
  import jax
  n = jax.device_count()
  src = f"model.source={tiny_smol}"  # a small folder: the bundled GGUF's tensor table takes ~9 s to parse
  report = dry_run_report(load_config("configs/grpo_arith.py:smoke", [src]))
  assert f"# mesh: data={n} x fsdp=1 over {n} " in report and "# memory plan per device" in report
  assert "rollout phase:" in report and "update phase:" in report
  three = load_config("configs/grpo_arith.py:smoke", [src, f"mesh.fsdp={3 * n}"])
  assert f"# planning for the {3 * n} devices config.mesh names" in dry_run_report(three)  # a dry run plans for them
  with pytest.raises(ConfigError, match=rf"config.mesh \(data=-1, fsdp={3 * n}\)"):  # a run on these devices cannot
    plan_for(three)


def test_per_device_estimate_splits_weights_over_fsdp_and_the_batch_over_all():
  est = {"weights_gib": 8.0, "lora_and_optimizer_gib": 1.0, "kv_cache_gib": 4.0,
         "activation_checkpoints_gib": 2.0}
  out = per_device_gib(est, data=2, fsdp=4)
  assert out == {"weights_gib": 2.0, "lora_and_optimizer_gib": 1.0, "kv_cache_gib": 0.5,
                 "activation_checkpoints_gib": 0.25, "total_gib": 3.75}
