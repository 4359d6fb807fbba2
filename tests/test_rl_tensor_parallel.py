"""RL with tensor-parallel rollouts (config.mesh.model, `fineflax.rl.learner`) on 4 forced CPU devices equals one
device: a tiny random Llama (NF4 base, LoRA, f32) with mesh data=2 x fsdp=2 for the update and model=2 for the
rollouts (rows split over the 2 groups of 2 devices, each group one tensor-parallel engine) gives the same greedy rollout tokens, the same multi-turn session with tool-output appends (Search-R1's
SamplerSession), the same sampled rollouts and the same loss and grad norm of one
GRPO step (RLJob.step); the launch.py entry runs a step with mesh.model=2; a model that does not split is a
clear error naming config.mesh.model.

Each run is a subprocess: XLA_FLAGS must force the devices before jax is imported.
"""
import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from fineflax.testing.devices import ROOT, cpu_devices_env, run_script


STEP = textwrap.dedent("""
    import json, sys
    import jax, numpy as np
    from fineflax.jobs.resolve import load_config
    from fineflax.jobs.rl import RLJob
    config = load_config("configs/grpo_arith.py:smoke", sys.argv[2:])
    job = RLJob(config)
    learner = job.learner
    policy = learner.policy(learner.state["params"])
    out = {"devices": jax.device_count(), "rollout_mesh": None if learner.rollout_mesh is None
           else dict(learner.rollout_mesh.shape)}
    if learner.rollout_mesh is not None:
      q = learner.rollout_base["layers"]["q"]["kernel"]
      out["q_split"] = str(jax.tree.leaves(q)[0].sharding.spec)
    prompts = [job.env.prompt(item) for item in job.env.train_items[:3]]
    greedy = policy.sample(prompts, greedy=True)
    out["greedy"] = greedy.tokens.tolist()
    # Search-R1's multi-turn session (SamplerPolicy -> SamplerSession) on the policy: tool text appended
    from fineflax.sampling.session import SamplerSession
    s = SamplerSession(policy.base, policy.model_config, max_total_len=24, temperature=0.0, lora=policy.lora,
                       lora_scale=policy.lora_scale, dtype=policy.dtype, eos_ids=(), mesh=policy.mesh)
    s.start(prompts)
    s.decode(3)
    s.append({0: [20, 21], 2: [22]})
    s.decode(4)
    if learner.rollout_mesh is not None:  # one tensor-parallel engine per group of the rollout mesh
      groups = learner.rollout_mesh.devices.reshape(-1, learner.rollout_mesh.shape["model"]).tolist()
      engines = [x.engine.mesh for x in s._replicas.sessions] if len(groups) > 1 else [s.engine.mesh]
      out["session_groups"] = [sorted(d.id for d in m.devices.flat) for m in engines]
      assert out["session_groups"] == [sorted(d.id for d in g) for g in groups], out["session_groups"]
    turns = s.result()
    out["session"] = [turns.tokens.tolist(), turns.valid.tolist()]
    state, m = job.step(learner.state, 1)
    out.update({k: float(m[k]) for k in ("loss", "grad_norm", "reward_mean", "completion_length")})
    print("RESULT " + json.dumps(out), flush=True)
""")


def _tiny_model(path):
  """A tiny random Llama with SmolLM2's tokenizer whose heads split over 2 devices in NF4 (column kernels'
  outputs multiples of 2 x 64)."""
  from fineflax.models.load import load_tokenizer
  from fineflax.testing.hf_models import make_hf_model
  make_hf_model("smollm2", path, vocab_size=49152, hidden_size=128, intermediate_size=256, num_attention_heads=4,
                num_key_value_heads=2, head_dim=64, initializer_range=0.3)
  load_tokenizer("smollm2-135m-instruct").save_pretrained(path)
  return str(path)


def _step(devices: int, overrides: list[str]) -> dict:
  r = run_script(STEP, "-", *overrides, devices=devices, timeout=1200)
  lines = [l for l in r.stdout.splitlines() if l.startswith("RESULT ")]
  assert r.returncode == 0 and lines, r.stdout[-2000:] + r.stderr[-3000:]
  return json.loads(lines[-1][len("RESULT "):])


@pytest.mark.fast
def test_a_model_axis_that_does_not_divide_the_devices_is_a_config_error_naming_it():
  import jax
  from fineflax.config_checks import ConfigError
  from fineflax.jobs.resolve import load_config
  from fineflax.jobs.rl import run_meshes
  n = jax.device_count()
  mesh, rollouts = run_meshes(load_config("configs/grpo_arith.py:smoke", []))
  assert rollouts is None and mesh.devices.size == n  # model = 1: rollouts on the update's mesh, as before
  with pytest.raises(ConfigError, match=rf"^config.mesh.model={n + 1}: mesh: {n} devices are not divisible by "
                                        rf"model={n + 1}$"):
    run_meshes(load_config("configs/grpo_arith.py:smoke", [f"mesh.model={n + 1}"]))


@pytest.mark.long
def test_tensor_parallel_rollouts_equal_one_device_and_the_job_runs_with_mesh_model(tmp_path):
  model = _tiny_model(tmp_path / "tiny")
  common = [f"model.source={model}", "model.quant=nf4", "rl.max_new_tokens=8", "task.num_train=16",
            "task.num_eval=4", "rl.prompts_per_step=2", "rl.group_size=2"]
  one = _step(1, common)
  tp = _step(4, common + ["mesh.data=2", "mesh.fsdp=2", "mesh.model=2"])
  assert one["rollout_mesh"] is None and tp["devices"] == 4
  assert tp["rollout_mesh"] == {"data": 2, "fsdp": 1, "model": 2}  # rows over 2 groups, each model=2
  assert len(tp["session_groups"]) == 2 and sorted(sum(tp["session_groups"], [])) == [0, 1, 2, 3]
  assert "model" in tp["q_split"], tp["q_split"]  # the rollout copy is split over the model axis
  assert tp["greedy"] == one["greedy"] and tp["session"] == one["session"]
  assert tp["completion_length"] == one["completion_length"] and tp["reward_mean"] == one["reward_mean"]
  for k in ("loss", "grad_norm"):
    np.testing.assert_allclose(tp[k], one[k], rtol=1e-5, atol=1e-6, err_msg=k)

  bad = run_script(STEP, "-", *common, "mesh.model=4", devices=4, timeout=600)  # 2 kv heads over 4 devices
  assert bad.returncode != 0 and "config.mesh.model=4: tensor parallelism over 4 devices: config.num_kv_heads=2 " \
                                 "is not divisible by 4" in bad.stderr, bad.stderr[-2000:]

  work = tmp_path / "run"
  args = [sys.executable, "launch.py", "--config", "configs/grpo_arith.py:smoke", "--workdir", str(work),
          *(f"--config.{o}" for o in common + ["num_steps=1", "eval_at_start=False", "mesh.data=2", "mesh.fsdp=2",
                                               "mesh.model=2"])]
  r = subprocess.run(args, cwd=ROOT, env=cpu_devices_env(4), capture_output=True, text=True, timeout=1200)
  assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
  from fineflax.train.loop import read_history
  history = read_history(str(work))
  assert [h["step"] for h in history if "loss" in h] == [1] and np.isfinite(history[-1]["loss"]), history
