"""The Learner (fineflax.rl.learner) takes one RL step exactly as the job's former inline path did: the same
pieces (setup_model, make_rl_fns, init_state, collect with LUFFY guidance, update_batch, rl_update) wired
by hand from the ConfigDict here, against `RLJob.step`, which goes through RLConfig and the Learner."""
import jax
import numpy as np
import pytest

from fineflax import lora as lora_lib
from fineflax.envs import make_env
from fineflax.jobs import rl as rl_job
from fineflax.jobs.resolve import load_config
from fineflax.rl.collect import collect, kept_groups
from fineflax.rl.guidance import Guidance
from fineflax.rl.objectives import get_objective
from fineflax.rl.order import EpochOrder
from fineflax.rl.policy import Policy
from fineflax.rl.step import make_rl_fns
from fineflax.rl.update import rl_update, update_batch
from fineflax.mesh import make_mesh, replicate, shard_params
from fineflax.train.model_setup import compute_dtype, setup_model
from fineflax.train.optim import make_optimizer
from fineflax.train.state import init_state


def old_path_step(config):
  """Step 1 of the RL job as `jobs/rl.py` wrote it before the Learner (setup_learner + RLJob.step)."""
  rl = config.rl
  objective = get_objective(rl.objective)
  mesh = make_mesh(config.mesh.data, config.mesh.fsdp)
  dtype = compute_dtype(config)
  base, model_config, tok, lora_cfg, lora = setup_model(config)
  base = shard_params(base, mesh)
  scale = lora_lib.lora_scale(lora_cfg)
  optimizer = make_optimizer(config.optimizer)
  fwd = dict(model_config=model_config, lora_scale=scale, remat=config.model.remat, dtype=dtype,
             logits_chunk=config.model.logits_chunk, temperature=rl.temperature)
  step_fn, logp_fn = make_rl_fns(optimizer, objective=rl.objective, loss_kwargs=objective.kwargs(rl), fwd_kwargs=fwd)
  state = replicate(init_state(lora, optimizer, config.seed), mesh)
  guidance = Guidance(rl.luffy.n_off, rl.luffy.traces_path)
  env = make_env(config, tok)
  order = EpochOrder(len(env.train_items), config.seed)
  rng = jax.random.PRNGKey(config.seed + 7)
  policy = Policy(base, model_config, tok, state["params"], scale, dtype, rl.temperature, rl.top_p,
                  rl.max_new_tokens, mesh, bool(rl.get("dense_rollouts", False)))
  g = collect(env, policy, env.train_items, order, 0, jax.random.fold_in(rng, 1), rl, config.rewards,
              guidance=guidance)
  batch = update_batch(g.rows, g.rewards, kept_groups(g, rl), group_size=rl.group_size, pad_id=policy.pad_id,
                       max_new_tokens=rl.max_new_tokens, advantage_scale=rl.advantage_scale,
                       fields=objective.batch_fields)
  state, metrics = rl_update(state, base, batch, step_fn=step_fn, logp_fn=logp_fn, beta=rl.beta,
                             num_iterations=rl.num_iterations, mesh=mesh)
  on = ~np.asarray(g.rows["off_policy"])
  return state, dict(metrics, reward_mean=float(g.rewards[on].mean()))


@pytest.mark.slow
@pytest.mark.long  # over 20 s (main's tier marks): 113 s on a loaded 2-core machine
def test_one_learner_step_equals_the_former_inline_step(tiny_smol):
  over = {"model.source": tiny_smol, "rl.max_new_tokens": 8, "task.num_eval": 4, "task.num_train": 16,
          "rl.beta": 0.01, "lora.targets": "('q','v')"}  # beta > 0: the reference log-probs are compared too
  config = load_config("configs/grpo_arith.py:luffy,smoke", [f"{k}={v}" for k, v in over.items()])
  old_state, old = old_path_step(config)
  job = rl_job.RLJob(config)
  new_state, new = job.step(job.learner.state, 1)
  assert old["off_policy_prob"] > 0  # the guidance rows entered the loss
  for key, value in old.items():
    np.testing.assert_allclose(new[key], value, rtol=1e-6, atol=1e-6, err_msg=key)
  for a, b in zip(jax.tree.leaves(old_state["params"]), jax.tree.leaves(new_state["params"])):
    np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-6, atol=1e-6)
  assert int(new_state["step"]) == int(old_state["step"]) == 1
