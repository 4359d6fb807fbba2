"""fineflax worker of benchmarks/rl.py: the RL job's own step (fineflax.jobs.rl) on random weights.

Set up as `fineflax.rl.learner.Learner` does (config sections from configs/common.py, `validate_rl`,
`make_optimizer`, `make_rl_fns`, `init_state`), with `init_params` in place of a checkpoint. One step:
  rollout  `fineflax.sampling.generate` (what `Policy.sample` calls, eos_ids=() so every row has exactly
           `new_tokens` tokens) of prompts x group rows (texts decoded), `rows.sampled_rows`, the rewards;
  update   `update.update_batch` (group advantages, padded batch) + `update.rl_update` (old log-probs, one
           jitted optimizer step of the GRPO-family loss), metrics fetched to the host; as the Learner does,
           through `minibatch.UpdatePlan` when spec["micro_batch_size"] (rows) or ["micro_batch_tokens"] is
           set, and without the old-log-prob pass when `update.reuses_current_logp` (spec["old_logp"],
           default "auto": config.rl.old_logp's default).
spec["decode_impl"] (default "auto", `fineflax.engine.decode.decode_impl`: unrolled on GPUs) picks the
sampler's decoder, as config.rl.decode_impl does for the RL job; spec["paged_attention"] (default "auto") the
engine's paged attention kernel (`fineflax.engine.engine.Engine(attention=)`).
spec["params"] = "full" (benchmarks/tunix_grpo.py): `config.train.params="full"` as the Learner sets it up
(fineflax/train/trainable.py): the trainable pytree is the whole bf16 model, base=None, AdamW moments f32
(`make_optimizer`), rollouts sample from the current parameters (no LoRA, no weight sync).
spec["shape"]["arch"] = "qwen2": q/k/v biases (Qwen2's `attention_bias`), RMSNorm eps s["norm_eps"].
"""
from __future__ import annotations

import os
import time

from benchmarks import _rl_common as C


def run(spec: dict) -> dict:
  import jax
  import jax.numpy as jnp
  import ml_collections
  import numpy as np

  from configs import common
  from fineflax import lora as lora_lib
  from fineflax.models import ModelConfig, init_params
  from fineflax.models.quantize import quantize_params
  from fineflax.rl import rows as R
  from fineflax.engine.decode import decode_impl
  from fineflax.rl.config import RLConfig
  from fineflax.rl.minibatch import UpdatePlan
  from fineflax.rl.step import make_rl_fns
  from fineflax.rl.update import reuses_current_logp, rl_update, update_batch
  from fineflax.sampling import generate
  from fineflax.train.optim import make_optimizer
  from fineflax.train.state import init_state

  t_setup = time.perf_counter()
  s, n_new = spec["shape"], spec["new_tokens"]
  mc = ModelConfig(vocab_size=s["vocab"], hidden_size=s["hidden"], intermediate_size=s["inter"],
                   num_layers=s["layers"], num_heads=s["heads"], num_kv_heads=s["kv_heads"],
                   head_dim=s["head_dim"], rope_theta=s["rope_theta"], tie_word_embeddings=True,
                   attention_bias=s.get("arch") == "qwen2", rms_norm_eps=s.get("norm_eps", 1e-5),
                   max_position_embeddings=max(2048, spec["prompt_len"] + n_new),
                   eos_token_ids=(C.EOS_ID,), pad_token_id=C.PAD_ID)
  dtype = jnp.bfloat16
  cfg = ml_collections.ConfigDict()
  common.lora(cfg, r=C.LORA_R, alpha=C.LORA_ALPHA, dropout=0.0, targets=C.LINEARS)
  common.rl(cfg, prompts_per_step=spec["prompts"], group_size=spec["group"], max_new_tokens=n_new,
            temperature=1.0)
  cfg.rl.agg_mode = spec["agg_mode"]
  cfg.rl.epsilon_low, cfg.rl.epsilon_high = C.EPS_LOW, C.EPS_HIGH
  cfg.rl.decode_impl = spec.get("decode_impl", "auto")
  cfg.rl.old_logp = spec.get("old_logp", "auto")
  cfg.rl.micro_batch_size = spec.get("micro_batch_size", 0)
  cfg.rl.micro_batch_tokens = spec.get("micro_batch_tokens", 0)
  common.optimizer(cfg, num_steps=1000, learning_rate=C.LR, warmup_steps=0, b2=0.999)
  rl = RLConfig.from_config(cfg.rl)
  objective = rl.objective_entry
  impl = decode_impl(rl.decode_impl)

  base = init_params(mc, jax.random.PRNGKey(0), dtype=dtype)
  full = spec.get("params", "lora") == "full"
  if spec.get("quant", "none") == "nf4" and not full:  # QLoRA: the frozen base in NF4 (rollouts and update)
    base = quantize_params(base, kind="nf4")
  lora_cfg = lora_lib.LoraConfig.from_mapping(cfg.lora)
  scale = 0.0 if full else lora_lib.lora_scale(lora_cfg)
  optimizer = make_optimizer(cfg.optimizer)
  fwd = dict(model_config=mc, lora_scale=scale, remat=spec["remat"], dtype=dtype,
             logits_chunk=spec["logits_chunk"], temperature=rl.temperature)
  on_policy = reuses_current_logp(rl, rl.num_iterations)
  step_fn, logp_fn = make_rl_fns(optimizer, objective=rl.objective, loss_kwargs=objective.kwargs(rl),
                                 fwd_kwargs=fwd, on_policy=on_policy)
  plan = (UpdatePlan(rl, optimizer=optimizer, objective=rl.objective, loss_kwargs=objective.kwargs(rl), fwd_kwargs=fwd,
                     logp_fn=logp_fn, pad_id=C.PAD_ID) if rl.micro_batch_size or rl.micro_batch_tokens else None)
  if full:  # the model is the trainable pytree; no frozen base
    state, base = init_state(base, optimizer, 0), None
  else:
    state = init_state(lora_lib.init_lora(base, mc, lora_cfg, jax.random.PRNGKey(1)), optimizer, 0)
  jax.block_until_ready((base, state))
  n_trainable = sum(x.size for x in jax.tree.leaves(state["params"]))
  setup_s = time.perf_counter() - t_setup

  tok = C.word_tokenizer(s["vocab"])  # texts are decoded as in the RL job; rewards read them
  prompts = [p for p in C.prompts(spec) for _ in range(rl.group_size)]  # grouped rows, like the RL job
  split, rng, metrics, lengths = C.Split(), jax.random.PRNGKey(7), {}, []
  for i in range(spec["warmup"] + spec["steps"]):
    split.new_step()
    t0 = time.perf_counter()
    weights, lora = (state["params"], None) if full else (base, state["params"])
    out = generate(weights, mc, prompts, max_new_tokens=n_new, temperature=rl.temperature, top_p=rl.top_p,
                   eos_ids=(), tokenizer=tok, rng=jax.random.fold_in(rng, i), lora=lora,
                   lora_scale=scale, dtype=dtype, impl=impl, attention=spec.get("paged_attention", "auto"))  # returns NumPy arrays: synchronised
    t1 = time.perf_counter()
    rows = R.sampled_rows(prompts, out, mask_truncated=rl.mask_truncated)
    rewards = np.array([C.reward_of_text(t) for t in rows["text"]], np.float32)
    t2 = time.perf_counter()
    batch = update_batch(rows, rewards, np.ones(spec["prompts"], bool), group_size=rl.group_size,
                         pad_id=C.PAD_ID, max_new_tokens=n_new, advantage_scale=rl.advantage_scale,
                         fields=objective.batch_fields)
    state, metrics = rl_update(state, base, batch, step_fn=step_fn, logp_fn=logp_fn, beta=rl.beta,
                               num_iterations=rl.num_iterations, plan=plan,
                               on_policy=on_policy)  # metrics are host floats: synchronised
    t3 = time.perf_counter()
    split.add("generate", t1 - t0)
    split.add("rollout", t2 - t0)
    split.add("update", t3 - t2)
    split.add("step", t3 - t0)
    lengths.append(float(np.mean(out.lengths)))
    if not np.isfinite(metrics.get("loss", np.nan)):
      raise FloatingPointError(f"fineflax loss is {metrics.get('loss')}")
  res = C.summarize(split, spec["warmup"])
  micro = (f"micro-batches of {rl.micro_batch_size} rows" if rl.micro_batch_size else
           f"packed micro-batches of {rl.micro_batch_tokens} tokens" if rl.micro_batch_tokens else
           "all rows in one update")
  from benchmarks import gpu
  return {**res, "setup_s": setup_s, "loss": metrics["loss"], "completion_len": lengths[-1],
          "peak_bytes": gpu.jax_peak_bytes(), "trainable_params": int(n_trainable),
          "settings": f"jit, {micro}; remat={spec['remat']}, logits_chunk={spec['logits_chunk']}, "
                      f"agg={rl.agg_mode}, decoder {impl} (paged attention {spec.get('paged_attention', 'auto')}), "
                      "old log-probs "
                      + ("the step's own (stop_gradient, one step per batch)" if on_policy else "recomputed")
                      + (", all parameters trained (bf16, f32 AdamW moments)" if full else "")
                      + (", NF4 base (QLoRA), FINEFLAX_NF4_LAYOUT=" + os.environ.get("FINEFLAX_NF4_LAYOUT", "auto")
                         if spec.get("quant") == "nf4" and not full else ""),
          "versions": {"jax": jax.__version__}}
