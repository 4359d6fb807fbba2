"""tunix worker of benchmarks/rl.py: `tunix.rl.grpo.grpo_learner.GRPOLearner` on random weights.

Same step as the fineflax worker: tunix's Llama3 nnx model with the shape (tied embeddings, bf16 weights,
no remat: with `RematConfig.DECODER` tunix 0.1.7's sampler fails, nnx.remat inside its decode while-loop
raises flax TraceContextError "Cannot mutate Param from a different trace level"; so tunix's update keeps
every activation, which favours it), qwix LoRA r=16 alpha=32 on q,k,v,o,gate,up,down, the vanilla
rollout engine colocated on the one GPU (prompts x group rows in one rollout micro-batch, exactly
`new_tokens` tokens: the EOS id is one the model cannot sample), temperature 1, the same rewards, loss
"grpo" with loss_agg_mode "token-mean", epsilon 0.2 / epsilon_high 0.28, beta 0, AdamW + clip 1.0, one
optimizer step per rollout (mini batch = all prompts), training micro-batches of `trl_micro` rows.
Phases: step = `_run_global_step` + weight sync (synchronised); rollout = `_generate_and_compute_advantage`
(generate, decode, rewards, advantages); generate = `RLCluster.generate`; update = step - rollout.

spec["params"] = "full" (benchmarks/tunix_grpo.py): no qwix LoRA; tunix then trains every nnx.Param
(`PeftTrainer`: `nnx.Optimizer(wrt=nnx.Param)`, gradients of the whole model), and the colocated rollout
reads the trained model itself (actor and rollout share one mesh: `RLCluster` uses one model for both).
The optimizer is then `fineflax.train.optim.with_f32_state` around the same clip + AdamW, so both
frameworks keep bf16 parameters with f32 moments. spec["shape"]["arch"] = "qwen2": tunix's Qwen2 model
(q/k/v biases, `use_tied_embedding`), built in bf16 (`dtype` = `param_dtype` = bf16); else Llama3.
"""
from __future__ import annotations

import dataclasses
import tempfile
import time

from benchmarks import _rl_common as C


def run(spec: dict) -> dict:
  import jax
  import jax.numpy as jnp
  import optax
  import qwix
  import tunix
  from flax import nnx
  from tunix.rl import rl_cluster as rl_cluster_lib
  from tunix.rl.grpo import grpo_learner
  from tunix.rl.rollout import base_rollout
  from tunix.sft import metrics_logger

  t_setup = time.perf_counter()
  s, n_new, group = spec["shape"], spec["new_tokens"], spec["group"]
  full = spec.get("params", "lora") == "full"
  mc, policy_cls = model_config(s, spec.get("tunix_remat", "NONE"))
  if spec.get("tunix_preset"):  # the benchmark's shape is tunix's own published config of the model
    ref = getattr(type(mc), spec["tunix_preset"])()
    diff = {f: (getattr(mc, f), getattr(ref, f)) for f in PRESET_FIELDS if getattr(mc, f) != getattr(ref, f)}
    if diff:
      raise ValueError(f"shape differs from tunix's {spec['tunix_preset']}(): {diff} (ours, tunix's)")
  mesh = jax.make_mesh((1, 1), ("fsdp", "tp"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
  with mesh:
    base = policy_cls(mc, rngs=nnx.Rngs(0))
    gdef, state = nnx.split(base)
    base = nnx.merge(gdef, jax.tree.map(lambda x: x.astype(jnp.bfloat16), state))  # bf16 weights
    if full:
      policy = base
    else:
      names = "|".join(f".*{n}" for n in C.HF_TARGETS)
      policy = qwix.apply_lora_to_model(base, qwix.LoraProvider(module_path=names, rank=C.LORA_R,
                                                                 alpha=C.LORA_ALPHA), rngs=nnx.Rngs(1),
                                       **base.get_model_input())
  n_trainable = sum(x.size for x in jax.tree.leaves(nnx.state(policy, nnx.Param if full else nnx.LoRAParam)))
  tok = C.word_tokenizer(s["vocab"])
  tok.eos_token_id  # noqa: B018 - the adapter reads it; rollouts stop only at `eos_tokens` below

  rows = spec["prompts"] * group
  micro_prompts = max(1, min(spec["trl_micro"], rows) // group)
  optimizer = optax.chain(optax.clip_by_global_norm(1.0),
                          optax.adamw(C.LR, b1=0.9, b2=0.999, eps=1e-8, weight_decay=0.0))
  if full:  # f32 moments of the bf16 parameters, as fineflax's optimizer
    from fineflax.train.optim import with_f32_state
    optimizer = with_f32_state(optimizer)
  log_dir = tempfile.mkdtemp(prefix="tunix_grpo_")
  training = rl_cluster_lib.RLTrainingConfig(
      actor_optimizer=optimizer, eval_every_n_steps=10_000, max_steps=spec["warmup"] + spec["steps"],
      mini_batch_size=spec["prompts"], train_micro_batch_size=micro_prompts,
      rollout_micro_batch_size=spec["prompts"], compute_logps_micro_batch_size=micro_prompts,
      metrics_logging_options=metrics_logger.MetricsLoggerOptions(log_dir=log_dir, flush_every_n_steps=1000),
      checkpoint_root_directory=None, pbar_description=None)
  rollout = base_rollout.RolloutConfig(
      max_tokens_to_generate=n_new, max_prompt_length=spec["prompt_len"],
      kv_cache_size=spec["prompt_len"] + n_new + 32, temperature=1.0, top_p=1.0, top_k=None,
      eos_tokens=[s["vocab"]], data_type=jnp.bfloat16)  # an id outside the vocabulary: no early stop
  cluster_cfg = rl_cluster_lib.ClusterConfig(
      role_to_mesh={r: mesh for r in (rl_cluster_lib.Role.ACTOR, rl_cluster_lib.Role.REFERENCE,
                                      rl_cluster_lib.Role.ROLLOUT)},
      rollout_engine="vanilla", offload_to_cpu=False, training_config=training, rollout_config=rollout)
  cluster = rl_cluster_lib.RLCluster(actor=policy, reference=None, tokenizer=tok, cluster_config=cluster_cfg)

  @dataclasses.dataclass(kw_only=True)
  class Config(grpo_learner.GRPOConfig):
    epsilon_high: float = C.EPS_HIGH  # read by tunix's grpo loss when present (DAPO clip-higher)

  algo = Config(num_generations=group, num_iterations=1, beta=0.0, epsilon=C.EPS_LOW,
                loss_agg_mode=spec["agg_mode"], policy_loss_fn="grpo", advantage_estimator="grpo")

  def reward(prompts, completions, **_):
    return [C.reward_of_text(c) for c in completions]

  split, marks = C.Split(), {}
  sync = lambda: jax.effects_barrier()

  class Timed(grpo_learner.GRPOLearner):
    def _generate_and_compute_advantage(self, *a, **k):
      t = time.perf_counter()
      out = super()._generate_and_compute_advantage(*a, **k)
      jax.block_until_ready(out.advantages)
      marks["rollout"] = marks.get("rollout", 0.0) + time.perf_counter() - t
      return out

    def _run_global_step(self, *a, **k):
      sync()
      t = time.perf_counter()
      super()._run_global_step(*a, **k)
      jax.block_until_ready(nnx.state(self.rl_cluster.actor_trainer.model, nnx.Param if full else nnx.LoRAParam))
      split.new_step()
      split.add("step", time.perf_counter() - t)
      split.add("rollout", marks.pop("rollout", 0.0))
      split.add("generate", marks.pop("generate", 0.0))

  learner = Timed(rl_cluster=cluster, algo_config=algo, reward_fns=[reward])
  sync_weights, generate = cluster.sync_weights, cluster.generate

  def timed_generate(*a, **k):
    t = time.perf_counter()
    out = generate(*a, **k)
    jax.effects_barrier()
    marks["generate"] = marks.get("generate", 0.0) + time.perf_counter() - t
    return out
  cluster.generate = timed_generate

  def timed_sync():  # the weight sync after a global step (skipped when actor and sampler share weights)
    t = time.perf_counter()
    sync_weights()
    jax.effects_barrier()
    split.add("step", time.perf_counter() - t)
  cluster.sync_weights = timed_sync

  prompts = [C.text_of(p) for p in C.prompts(spec)]
  data = [{"prompts": prompts} for _ in range(spec["warmup"] + spec["steps"])]
  setup_s = time.perf_counter() - t_setup
  with mesh:
    learner.train(data)
  for st in split.steps:
    st["update"] = st["step"] - st["rollout"]
  res = C.summarize(split, spec["warmup"])
  from benchmarks import gpu
  return {**res, "setup_s": setup_s, "peak_bytes": gpu.jax_peak_bytes(), "completion_len": None,  # not read back from tunix
          "trainable_params": int(n_trainable),
          "settings": f"{type(base).__name__} model, vanilla rollout engine, colocated; loss grpo/{spec['agg_mode']}, "
                      f"micro-batch {micro_prompts * group} rows, remat {mc.remat_config.name}"
                      + (", all parameters trained, f32 AdamW moments" if full else ""),
          "versions": {"tunix": getattr(tunix, "__version__", "?"), "qwix": getattr(qwix, "__version__", "?"),
                       "jax": jax.__version__}}


PRESET_FIELDS = ("num_layers", "vocab_size", "embed_dim", "hidden_dim", "num_heads", "head_dim", "num_kv_heads",
                 "rope_theta", "norm_eps", "use_tied_embedding")


def model_config(s: dict, remat: str):
  """(tunix ModelConfig, model class) of the benchmark shape `s`: Qwen2 (s["arch"] == "qwen2": q/k/v
  biases, tied embeddings, RMSNorm eps s["norm_eps"]) or Llama3 (tied), bf16, tunix RematConfig `remat`."""
  import jax.numpy as jnp
  common = dict(num_layers=s["layers"], vocab_size=s["vocab"], embed_dim=s["hidden"], hidden_dim=s["inter"],
                num_heads=s["heads"], head_dim=s["head_dim"], num_kv_heads=s["kv_heads"],
                rope_theta=int(s["rope_theta"]), norm_eps=s.get("norm_eps", 1e-5))
  if s.get("arch", "llama") == "qwen2":
    from tunix.models.qwen2 import model as qwen2
    return (qwen2.ModelConfig(**common, use_tied_embedding=True, remat_config=qwen2.RematConfig[remat],
                              dtype=jnp.bfloat16, param_dtype=jnp.bfloat16), qwen2.Qwen2)
  from tunix.models.llama3 import model as llama3
  return llama3.ModelConfig(**common, weight_tying=True, remat_config=llama3.RematConfig[remat]), llama3.Llama3
