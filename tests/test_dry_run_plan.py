"""One memory estimate a dry run (issue 52 items 3 and 4): the plan of the mode in use (full: no LoRA lines, the
trained parameters, f32 gradient sums and the moments' dtype counted; LoRA: the adapter's), one verdict, and on a
machine with fewer devices than a config's mesh names, a plan for the named devices with a line saying so."""
import re

import jax
import pytest

from fineflax.jobs import dry_run_report, named_devices
from fineflax.jobs.memory_plan import GIB, inputs_from_config, phases
from fineflax.jobs.resolve import load_config

pytestmark = pytest.mark.fast
PAPERS = ("configs/papers/luffy.py", "configs/papers/exgrpo.py", "configs/papers/search_r1.py:grpo")


def _terms(report: str, phase: str) -> dict[str, float]:
  block = report.split(f"{phase} phase:")[1].split("phase:")[0]
  return {k: float(v) for k, v in re.findall(r"^  (\w+): ([\d.]+)$", block, re.M)}


def test_a_full_parameter_plan_has_no_lora_lines_and_counts_its_mode():
  config = load_config("configs/papers/luffy.py")
  report = dry_run_report(config, devices=8, device_memory_gb=80)
  assert "LoRA" not in report and "lora_and_optimizer" not in report and "total_gib" not in report
  assert report.count("verdict:") == 1 and "params=full" in report
  assert "trainable parameters (train.params=full): 7,615,616,512 (master float32, AdamW moments float32)" in report
  p = 7_615_616_512
  update = _terms(report, "update")
  # f32 master weights (4 B), two f32 moments (8 B), the f32 gradient accumulator (4 B), all / fsdp; the backward
  # (the accumulator beside a micro-batch's activations, larger than its gradient) is the update's peak here
  assert update["parameters"] == pytest.approx(4 * p / 8 / GIB, abs=1e-3)
  assert update["optimizer"] == pytest.approx(8 * p / 8 / GIB, abs=1e-3)
  assert update["gradient_accumulator"] == pytest.approx(4 * p / 8 / GIB, abs=1e-3)
  assert update["activations"] > update["gradient_accumulator"] and "micro_batch_gradient" not in update
  assert "32768 tokens per update micro-batch" in report  # rl.micro_batch_tokens
  bf16 = load_config("configs/papers/luffy.py", ["train.moment_dtype=bfloat16", "train.master_dtype=bfloat16"])
  small = _terms(dry_run_report(bf16, devices=8, device_memory_gb=80), "update")
  assert small["optimizer"] == pytest.approx(update["optimizer"] / 2, abs=1e-3)
  assert small["parameters"] == pytest.approx(update["parameters"] / 2, abs=1e-3)
  assert small["gradient_accumulator"] == pytest.approx(update["gradient_accumulator"], abs=1e-3)  # f32 either way


def test_a_lora_plan_counts_the_adapter_and_the_frozen_base():
  config = load_config("configs/quickstart.py")
  report = dry_run_report(config, devices=1, device_memory_gb=24)
  assert "trainable LoRA parameters (r=16): 4,884,480" in report and "params=lora" in report
  assert report.count("verdict:") == 1 and "verdict: fits in 24.0 GiB" in report
  update = _terms(report, "update")
  assert update["parameters"] == pytest.approx(4 * 4_884_480 / GIB, abs=1e-3)
  assert "base_weights" in update and "total_gib" not in report
  plan = phases(inputs_from_config(config, 1, 1, 1))["update"]
  assert sum(plan.values()) / GIB == pytest.approx(float(re.search(r"update phase: ([\d.]+)", report)[1]), abs=0.01)


@pytest.mark.parametrize("spec", PAPERS)
def test_a_dry_run_on_one_device_plans_for_the_devices_the_config_names(spec, monkeypatch):
  monkeypatch.setattr(jax, "device_count", lambda: 1)
  config = load_config(spec)
  report = dry_run_report(config)
  assert ("# planning for the 8 devices config.mesh names (data=-1, fsdp=8, model=1); 1 visible here: "
          "pass --devices N to plan for another count") in report
  assert "# mesh: data=1 x fsdp=8 over 8 planned device(s)" in report and "update phase:" in report
  assert "verdict: device memory unknown" in report
  assert "verdict: fits in 80.0 GiB" in dry_run_report(config, device_memory_gb=80)
  assert named_devices(config, 4) == (4, "")  # --devices wins


def test_named_devices_keeps_the_visible_ones_when_the_mesh_fits_them(monkeypatch):
  monkeypatch.setattr(jax, "device_count", lambda: 8)
  assert named_devices(load_config("configs/papers/luffy.py")) == (None, "")
  monkeypatch.setattr(jax, "device_count", lambda: 6)
  assert named_devices(load_config("configs/papers/luffy.py", ["mesh.data=2", "mesh.fsdp=2"]))[0] == 4
