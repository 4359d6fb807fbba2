"""fineflax.jobs.memory_plan against the real thing on a tiny model (CPU): parameter and optimizer bytes equal
the pytrees' nbytes exactly; activation estimates are within a factor 2 of XLA's memory_analysis() of a
compiled gradient step; launch.py refuses a plan that cannot fit in one line naming a knob (exit 2)."""
import dataclasses
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import ml_collections
import pytest

from fineflax.jobs.memory_plan import PlanInputs, activation_bytes, resident
from fineflax.lora import LoraConfig, init_lora
from fineflax.models import ModelConfig
from fineflax.models.decoder import init_params
from fineflax.train.optim import make_optimizer
from fineflax.train.sft_step import sft_nll

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
QWEN_LIKE = ModelConfig(vocab_size=512, hidden_size=128, intermediate_size=384, num_layers=4, num_heads=4,
                        num_kv_heads=2, head_dim=32, model_type="qwen2", attention_bias=True)
TIED = ModelConfig(vocab_size=256, hidden_size=64, intermediate_size=160, num_layers=2, num_heads=4,
                   num_kv_heads=4, head_dim=16, tie_word_embeddings=True)


def _nbytes(tree) -> int:
  """Bytes of a pytree of arrays or of jax.eval_shape's ShapeDtypeStructs (the same shapes and dtypes)."""
  return sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(tree))


def _optimizer():
  cfg = ml_collections.ConfigDict(dict(num_steps=10, learning_rate=1e-4, warmup_steps=2, end_lr_ratio=1.0,
                                       weight_decay=0.01, b1=0.9, b2=0.999, grad_clip=1.0))
  return make_optimizer(cfg)


@pytest.mark.fast
@pytest.mark.parametrize("mc", [QWEN_LIKE, TIED], ids=["qwen2-bias-untied", "llama-tied"])
def test_parameter_and_optimizer_bytes_equal_the_real_pytrees(mc):
  full32 = jax.eval_shape(lambda: init_params(mc, jax.random.key(0), jnp.float32))  # shapes only: fast
  plan = resident(PlanInputs(model=mc, n_devices=1, fsdp=1, params="full", master_bytes=4))
  assert plan["parameters"] == _nbytes(full32)
  assert plan["optimizer"] == _nbytes(jax.eval_shape(_optimizer().init, full32))
  bf16 = jax.eval_shape(lambda: init_params(mc, jax.random.key(0), jnp.bfloat16))
  assert resident(PlanInputs(model=mc, n_devices=1, fsdp=1, params="full", master_bytes=2))["parameters"] == _nbytes(bf16)
  halved = resident(PlanInputs(model=mc, n_devices=4, fsdp=2, params="full", master_bytes=2))
  assert halved["parameters"] == _nbytes(bf16) / 2
  targets = ("q", "k", "v", "o", "gate", "up", "down")
  lora = jax.eval_shape(lambda p: init_lora(p, mc, LoraConfig(r=4, alpha=8.0, target_modules=targets),
                                            jax.random.key(1)), full32)
  plan = resident(PlanInputs(model=mc, n_devices=1, fsdp=1, params="lora", compute_bytes=2, quant="none",
                             lora_rank=4, lora_targets=targets))
  assert plan["parameters"] == _nbytes(lora) and plan["optimizer"] == _nbytes(jax.eval_shape(_optimizer().init, lora))
  assert plan["base_weights"] == _nbytes(bf16)


@pytest.mark.parametrize("remat", ["none", "full", "attn", "matmuls"])
def test_activation_estimate_is_within_a_factor_2_of_xla(remat):
  b, s = 2, 256
  mc, params = QWEN_LIKE, init_params(QWEN_LIKE, jax.random.key(0), jnp.float32)
  batch = {"tokens": jnp.zeros((b, s), jnp.int32), "targets": jnp.zeros((b, s), jnp.int32),
           "loss_mask": jnp.ones((b, s)), "attention_mask": jnp.ones((b, s), jnp.int32),
           "positions": jnp.tile(jnp.arange(s), (b, 1))}
  grad = jax.jit(jax.grad(lambda p, x: sft_nll(None, p, x, model_config=mc, lora_scale=1.0, remat=remat,
                                                dtype=jnp.float32, logits_chunk=128, causal_prefix=True)[0]))
  xla = grad.lower(params, batch).compile().memory_analysis().temp_size_in_bytes
  est = sum(activation_bytes(PlanInputs(model=mc, n_devices=1, fsdp=1, compute_bytes=4, params="full",
                                        master_bytes=4, remat=remat, attention="xla", logits_chunk=128,
                                        update_rows=b, prompt_tokens=s)).values())
  assert 0.5 <= xla / est <= 2.0, (remat, xla, est)


def test_launch_refuses_a_plan_that_cannot_fit_in_one_line_naming_a_knob():
  args = [sys.executable, os.path.join(ROOT, "launch.py"), "--config", "configs/papers/luffy.py", "--dry_run",
          "--devices", "8", "--device_memory_gb"]
  ok = subprocess.run(args + ["80"], cwd=ROOT, capture_output=True, text=True, timeout=120)
  assert ok.returncode == 0 and "verdict: fits in 80.0 GiB per device" in ok.stdout, ok.stderr
  bad = subprocess.run(args + ["24"], cwd=ROOT, capture_output=True, text=True, timeout=120)
  lines = bad.stderr.strip().splitlines()
  assert bad.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: plan does not fit: "), bad.stderr
  assert " set config." in lines[0] and "update phase:" in bad.stdout  # the plan is printed before the refusal


@pytest.mark.fast
def test_tensor_parallel_rollouts_split_weights_and_pages_and_the_70b_step_fits_4_gpus_only_with_them():
  """Rollout phase with mesh.model = t: the rollout copy of the base and the KV pages / t per device (rows split
  over the n / t groups, each one engine); NF4 column kernels at 4.5 bits as `tp_layout` stores them. The Llama-3.1-70B shape QLoRA GRPO
  step on 4 x 80 GiB (fsdp=4, bf16, 48 prompts x 8 rows x (512 + 1024) tokens): model=1 is refused naming
  config.mesh.model=2 (2 groups of 2 devices), model=2 and 4 fit."""
  from fineflax.engine import tensor_parallel as tp
  from fineflax.jobs.memory_plan import COLUMN, COLUMN_BLOCK_BITS, GIB, kv_bytes, phases
  from fineflax.jobs.plan_verdict import refusal
  from fineflax.models.estimate import linear_params, load_config
  from fineflax.models.quantize import quantize_params
  mc = ModelConfig(vocab_size=256, hidden_size=128, intermediate_size=256, num_layers=2, num_heads=4,
                   num_kv_heads=2, head_dim=64)
  laid = jax.eval_shape(lambda: tp.tp_layout(quantize_params(init_params(mc, jax.random.key(0)), kind="nf4"), 2))
  column = sum(_nbytes(laid["layers"][n]["kernel"]) for n in COLUMN)
  assert column == linear_params(mc, COLUMN) * COLUMN_BLOCK_BITS / 8
  one = PlanInputs(model=mc, n_devices=4, fsdp=4, quant="nf4", prompts=4, sampled_per_prompt=2, new_tokens=64)
  two = dataclasses.replace(one, tp=2)
  # 2 groups of 2 devices: 4 rows a group, their pages split over the group's 2 devices: R / n a device
  assert kv_bytes(two) == kv_bytes(one)
  four = dataclasses.replace(one, tp=4)
  assert kv_bytes(four) == kv_bytes(one)  # one group: all 8 rows, pages split over 4 devices
  # the rows a group counts are those of the busiest group of the real assignment (whole prompt groups)
  from fineflax.jobs.memory_plan import rollout_rows_per_device
  from fineflax.sampling.replicas import assign_rows
  for prompts, n, t in ((3, 4, 2), (5, 8, 2), (7, 8, 4), (4, 4, 4)):
    i = dataclasses.replace(one, prompts=prompts, n_devices=n, tp=t, sampled_per_prompt=3)
    rows = [[k] * 10 for k in range(prompts) for _ in range(3)]
    assert rollout_rows_per_device(i) == max(map(len, assign_rows(rows, n // t, budget=64))), (prompts, n, t)
  assert "gathered_base" in phases(one)["rollout"] and "rollout_weights" in phases(two)["rollout"]

  big = PlanInputs(model=load_config("meta-llama/Llama-3.1-70B"), n_devices=4, fsdp=4, quant="nf4", remat="full",
                   prompts=48, sampled_per_prompt=8, update_rows=384, prompt_tokens=512, new_tokens=1024,
                   micro_batch_tokens=4096)
  problem = refusal(big, 80 * GIB)
  # model=2: 2 groups of 2 devices, each half the rows: the smallest model axis that fits
  assert problem is not None and problem.startswith("the rollout phase") and problem.endswith("set config.mesh.model=2")
  assert refusal(dataclasses.replace(big, tp=2), 80 * GIB) is None
  assert refusal(dataclasses.replace(big, tp=4), 80 * GIB) is None
  weights = phases(dataclasses.replace(big, tp=4))["rollout"]
  assert 9 * GIB < weights["base_weights"] < weights["rollout_weights"] < 10 * GIB  # the docstring's 9.20 + 9.68


def test_dry_run_of_the_70b_shape_names_mesh_model_and_refuses_an_indivisible_one():
  args = [sys.executable, os.path.join(ROOT, "launch.py"), "--config", "configs/grpo_arith.py", "--dry_run",
          "--devices", "4", "--device_memory_gb", "80", "--config.model.source=meta-llama/Llama-3.1-70B",
          "--config.mesh.fsdp=4", "--config.model.dtype=bfloat16", "--config.rl.prompts_per_step=48", "--config.rl.group_size=8",
          "--config.rl.max_new_tokens=1024", "--config.model.remat=full", "--config.rl.micro_batch_tokens=4096"]
  run = lambda *extra: subprocess.run(args + list(extra), cwd=ROOT, capture_output=True, text=True, timeout=300)
  bad = run("--config.mesh.model=1")
  assert bad.returncode == 2 and bad.stderr.strip().endswith("set config.mesh.model=2"), bad.stderr
  ok = run("--config.mesh.model=4")
  assert ok.returncode == 0 and "verdict: fits in 80.0 GiB per device" in ok.stdout, ok.stderr
  assert "rollouts tensor-parallel over model=4" in ok.stdout and "rollout_weights" in ok.stdout
  odd = run("--config.mesh.model=3")
  assert odd.returncode == 2 and odd.stderr.strip() == "error: config.mesh.model=3: 4 devices are not divisible by it"
  kv = run("--devices", "16", "--config.mesh.model=16")  # the flag given last wins: 16 devices
  assert kv.returncode == 2 and kv.stderr.strip() == ("error: config.mesh.model=16: tensor parallelism over 16 devices: "
                                                      "config.num_kv_heads=8 is not divisible by 16"), kv.stderr


@pytest.mark.fast
def test_update_peak_counts_the_float32_gradient_and_narrow_moments_against_the_real_pytrees():
  """The optimizer moment of a full update holds the float32 gradient (the pytree of jax.grad in float32) and,
  with bfloat16 moments, their new copies (two bf16 trees); a single micro-batch has no accumulator, RL always one."""
  from fineflax.jobs.memory_plan import accumulates, update_phase
  mc = QWEN_LIKE
  params = jax.eval_shape(lambda: init_params(mc, jax.random.PRNGKey(0), dtype=jnp.float32))
  f32, bf16 = _nbytes(params), _nbytes(jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, jnp.bfloat16), params))
  sft = PlanInputs(model=mc, n_devices=1, fsdp=1, params="full", master_bytes=2, moment_bytes=2, update_rows=1,
                   prompt_tokens=8, micro_key="train.micro_batch_tokens")
  plan = update_phase(sft)
  assert not accumulates(sft) and plan["gradients"] == f32 and plan["new_moments"] == 2 * bf16
  rl = dataclasses.replace(sft, micro_key="rl.micro_batch_tokens", moment_bytes=4, update_rows=64, prompt_tokens=512)
  plan = update_phase(rl)
  assert accumulates(rl) and plan["gradient_accumulator"] == f32 and "new_moments" not in plan
  # a micro-batch budget below the device's rows makes SFT accumulate too
  assert accumulates(dataclasses.replace(sft, update_rows=8, micro_batch_tokens=8))
