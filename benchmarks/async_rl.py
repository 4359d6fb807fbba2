"""GRPO samples/s with rl.async_steps = 1 vs 0 at the same batch settings, and the rollout / learner mismatch.

  python -m benchmarks.async_rl                  # 2 GPUs (nvidia-h200-x2), < 5 min; writes $OUT (benchmarks/out)
  python -m benchmarks.async_rl --smoke          # CPU check: 2 forced CPU devices, tiny shape, prints only

Every case in this one process, random weights of the shape (benchmarks/_random_weights.py; no checkpoint),
the grpo_arith setting: 32 prompts (64 random tokens) x 8 samples, up to 128 new tokens, temperature 1 (EOS
of the random model ends few rows), random rewards of the decoded text (benchmarks/_rl_common.py), group
advantages, one AdamW update of LoRA r=16 on the 7 linears (DAPO token-mean loss). The step is the RL job's:
`fineflax.rl.async_rollouts.AsyncRollouts` with a `RolloutGroup` (the rollout device) for async 1, the
synchronous rollout-then-update for async 0 on one device, and on both devices (rows split over a data mesh,
as the RL job runs today on two GPUs). samples/s = rows / step s: the median (the speed-ups use it) and the
fastest of `--steps` timed steps after 2 untimed ones (the first compiles; async's second is the first with a
batch in flight). The fastest alone misleads for async: a step whose next batch was already decoded while the
previous one waited takes only the update's time (0.18 s against 0.9 s on 2026-11-28).
Mismatch: mismatch_kl (k3 estimate of KL(rollout || learner)) and mismatch_max_abs_dlogp of the update's
metrics at async 0 (the engine's sampled-token log-probs vs the learner's forward on the same weights), for
a bf16 and an NF4 base; at async 1 they include one update of staleness.
Results: OUT/async_rl.json and OUT/async_rl.md after every case.
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys
import time


def parse(argv=None):
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--out", default=os.environ.get("OUT", "benchmarks/out"))
  p.add_argument("--smoke", action="store_true")
  p.add_argument("--steps", type=int, default=8)
  p.add_argument("--models", nargs="*", default=None)
  return p.parse_args(argv)


class _Learner:
  """What `RolloutGroup` reads of `fineflax.rl.learner.Learner`: the frozen base, the policy of a LoRA."""

  def __init__(self, base, mc, tok, scale, rl, mesh):
    self.base, self.mc, self.tok, self.scale, self.rl, self.mesh = base, mc, tok, scale, rl, mesh

  def policy(self, lora):
    import jax.numpy as jnp
    from fineflax.rl.policy import Policy
    rl = self.rl
    return Policy(self.base, self.mc, self.tok, lora, self.scale, jnp.bfloat16, rl.temperature, rl.top_p,
                  rl.max_new_tokens, self.mesh, False, rl.decode_impl)


def run_case(spec: dict) -> dict:
  import jax
  import jax.numpy as jnp
  import ml_collections
  import numpy as np

  from benchmarks import _rl_common as C
  from benchmarks._random_weights import random_params
  from configs import common
  from fineflax import lora as lora_lib
  from fineflax.mesh import make_mesh, replicate, shard_params
  from fineflax.models import ModelConfig
  from fineflax.rl import rows as R
  from fineflax.rl.async_rollouts import AsyncRollouts, RolloutGroup
  from fineflax.rl.config import RLConfig
  from fineflax.rl.step import make_rl_fns
  from fineflax.rl.update import reuses_current_logp, rl_update, update_batch
  from fineflax.train.optim import make_optimizer
  from fineflax.train.state import init_state

  s = spec["shape"]
  mc = ModelConfig(vocab_size=s["vocab"], hidden_size=s["hidden"], intermediate_size=s["inter"],
                   num_layers=s["layers"], num_heads=s["heads"], num_kv_heads=s["kv_heads"], head_dim=s["head_dim"],
                   rope_theta=s["rope_theta"], tie_word_embeddings=True, max_position_embeddings=2048,
                   eos_token_ids=(C.EOS_ID,), pad_token_id=C.PAD_ID)
  cfg = ml_collections.ConfigDict()
  common.lora(cfg, r=C.LORA_R, alpha=C.LORA_ALPHA, dropout=0.0, targets=C.LINEARS)
  common.rl(cfg, prompts_per_step=spec["prompts"], group_size=spec["group"], max_new_tokens=spec["new_tokens"],
            temperature=1.0)
  cfg.rl.async_steps = spec["async_steps"]
  common.optimizer(cfg, num_steps=1000, learning_rate=C.LR, warmup_steps=0, b2=0.999)
  rl = RLConfig.from_config(cfg.rl)
  devices = jax.devices()
  learner_devices = devices[:spec["learner_devices"]]
  mesh = make_mesh(data=-1, fsdp=1, devices=learner_devices)
  base = shard_params(random_params(mc, spec["quant"], jax.random.PRNGKey(0), jnp.bfloat16), mesh)
  lcfg = lora_lib.LoraConfig.from_mapping(cfg.lora)
  scale = lora_lib.lora_scale(lcfg)
  opt = make_optimizer(cfg.optimizer)
  fwd = dict(model_config=mc, lora_scale=scale, remat="full", dtype=jnp.bfloat16, logits_chunk=32, temperature=1.0)
  on_policy = reuses_current_logp(rl, 1)
  step_fn, logp_fn = make_rl_fns(opt, objective=rl.objective, loss_kwargs=rl.objective_entry.kwargs(rl),
                                 fwd_kwargs=fwd, on_policy=on_policy)
  state = replicate(init_state(lora_lib.init_lora(base, mc, lcfg, jax.random.PRNGKey(1)), opt, 0), mesh)
  learner = _Learner(base, mc, C.word_tokenizer(s["vocab"]), scale, rl, mesh if len(learner_devices) > 1 else None)
  prompts = [p for p in C.prompts(spec) for _ in range(rl.group_size)]
  rng = jax.random.PRNGKey(7)

  def collect(params, step, policy, entropy_fn):
    out = (policy or learner.policy(params)).sample(prompts, jax.random.fold_in(rng, step))
    rows = R.sampled_rows(prompts, out)
    return rows, np.array([C.reward_of_text(t) for t in rows["text"]], np.float32)

  def update(state, groups):
    rows, rewards = groups
    batch = update_batch(rows, rewards, np.ones(rl.prompts_per_step, bool), group_size=rl.group_size,
                         pad_id=C.PAD_ID, max_new_tokens=rl.max_new_tokens, advantage_scale=rl.advantage_scale,
                         fields=rl.objective_entry.batch_fields)
    state, m = rl_update(state, base, batch, step_fn=step_fn, logp_fn=logp_fn, beta=0.0, num_iterations=1,
                         mesh=mesh, on_policy=on_policy)
    return state, dict(m, completion_length=float(np.mean([len(c) for c in rows["completion"]])))

  n = 2 + spec["steps"]
  group = RolloutGroup(learner, devices[len(learner_devices):]) if spec["async_steps"] else None
  pipe = AsyncRollouts(spec["async_steps"], n, collect, group) if spec["async_steps"] else None
  times, metrics = [], []
  for step in range(1, n + 1):
    t0 = time.perf_counter()
    if pipe is not None:
      state, m = pipe.step(state, step, lambda g: None, update)
    else:
      state, m = update(state, collect(state["params"], step, None, None))
    times.append(time.perf_counter() - t0)
    metrics.append(m)
  timed = times[2:]
  rows = rl.prompts_per_step * rl.group_size
  last = metrics[-1]
  return {"step_s_min": min(timed), "step_s_mean": float(np.mean(timed)), "step_s_median": float(np.median(timed)),
          "samples_per_s": rows / min(timed), "samples_per_s_mean": rows / float(np.mean(timed)),
          "samples_per_s_median": rows / float(np.median(timed)), "steps_s": times,
          "completion_length": last["completion_length"],
          **{k: last[k] for k in ("mismatch_kl", "mismatch_kl_k1", "mismatch_max_abs_dlogp", "is_weight_mean",
                                  "is_truncated_frac", "loss") if k in last},
          **({"time_wait_s": float(np.mean([m["time_wait_s"] for m in metrics[2:]]))} if pipe else {})}


def cases(args) -> list[dict]:
  from benchmarks.sft import SHAPES, SMOKE_SHAPES
  shapes = {k: v[0] for k, v in (SMOKE_SHAPES if args.smoke else SHAPES).items()}
  b = dict(prompts=2 if args.smoke else 32, group=2 if args.smoke else 8, prompt_len=8 if args.smoke else 64,
           new_tokens=8 if args.smoke else 128, steps=args.steps)
  picked = {m: sh for m, sh in shapes.items() if not args.models or m in args.models}
  case = lambda model, label, **kw: dict(b, model=model, shape=picked[model], label=label,
                                         **{"quant": "none", "learner_devices": 1, **kw})
  out = []  # the throughput pairs first, then the 2-device sync baselines, then NF4's mismatch (first model)
  for model in picked:
    out += [case(model, "sync, 1 device", async_steps=0),
            case(model, "async 1, learner 1 + rollout 1 device", async_steps=1)]
  out += [case(model, "sync, 2 devices (data mesh)", async_steps=0, learner_devices=2) for model in picked]
  out += [case(model, "sync, 1 device, NF4 base (mismatch)", async_steps=0, quant="nf4", steps=1)
          for model in list(picked)[:1]]
  return out


def report(rows: list[dict], device: str) -> str:
  from benchmarks._results import markdown_table
  header = ["model", "case", "base", "samples/s (median)", "samples/s (best)", "median step s", "wait s",
            "completion len", "mismatch KL", "max |dlogp|", "speed-up vs sync 1 dev (medians)", "vs sync 2 dev"]
  table = []
  for r in rows:
    if "error" in r:
      table.append([r["model"], r["label"], r["quant"], r["error"][:150]] + [""] * 8)
      continue
    ref = {x["label"]: x["samples_per_s_median"] for x in rows if x["model"] == r["model"] and "error" not in x}
    sp = lambda lab: f"{r['samples_per_s_median'] / ref[lab]:.2f}x" if ref.get(lab) else ""
    table.append([r["model"], r["label"], "bf16" if r["quant"] == "none" else r["quant"], r["samples_per_s_median"],
                  r["samples_per_s"], r["step_s_median"], r.get("time_wait_s", ""), r["completion_length"],
                  r.get("mismatch_kl", ""), r.get("mismatch_max_abs_dlogp", ""), sp("sync, 1 device"),
                  sp("sync, 2 devices (data mesh)")])
  return "\n".join([f"## Async GRPO (rl.async_steps 1 vs 0), {device}", "", __doc__.split("\n\n")[2], "",
                    markdown_table(header, table), ""])


def main(argv=None):
  args = parse(argv)
  if args.smoke:
    os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=2")
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
  import jax
  if jax.device_count() < 2:
    sys.exit(f"benchmarks.async_rl needs 2 devices; found {jax.device_count()}")
  device = f"{jax.device_count()} x {jax.devices()[0].device_kind}"
  out_dir = pathlib.Path(args.out)
  rows = []
  for spec in cases(args):
    print(f"--- {spec['model']}: {spec['label']}", flush=True)
    try:
      res = run_case(spec)
    except Exception as e:  # noqa: BLE001 - the table says why a case failed
      import traceback
      traceback.print_exc()
      res = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
    row = {k: v for k, v in spec.items() if k != "shape"} | res
    rows.append(row)
    print(json.dumps(row), flush=True)
    md = report(rows, device)
    if not args.smoke:
      out_dir.mkdir(parents=True, exist_ok=True)
      (out_dir / "async_rl.json").write_text(json.dumps({"device": device, "rows": rows}, indent=1))
      (out_dir / "async_rl.md").write_text(md)
  print(report(rows, device))


if __name__ == "__main__":
  main()
