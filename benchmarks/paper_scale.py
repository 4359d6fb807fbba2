"""The papers' recipes at their own model shapes (issue 31 targets 1 and 2): one full-parameter RL step of
LUFFY and of Search-R1's PPO with random weights of the published shapes, on every visible GPU.

  python -m benchmarks.paper_scale --recipe luffy --out DIR --results          # one device call a recipe:
  python -m benchmarks.paper_scale --recipe search_r1_ppo --out DIR --results  # rows of DIR/paper_scale.json kept
  python -m benchmarks.paper_scale --tiny --out DIR                   # CPU: tiny model on 2 forced host devices
  python -m benchmarks.paper_scale --recipe luffy --fit --max-new-tokens 2048 --budget 330 --out DIR
                                      # nvidia-h200-x2 (issue 46.3): the 7B shape, fsdp=2, the most prompts (<= 16)
                                      # the memory plan fits (benchmarks/_paper_fit.py), else a smaller shape

GPU defaults (sized for one 8-minute call a recipe on 4 x H200, not measured yet): luffy 16 prompts x 8 rows,
prompts of 512 tokens, lengths median 1024 capped at 4096 (the paper: 128 x 8, cap 8192); search_r1_ppo 32
prompts x 5 rollouts (the target's 512 x 5). Both recipes in one call share --budget seconds.

Each recipe runs in its own subprocess (JAX without preallocation, so the peak is the step's own) and is
the real run's pieces: the config of configs/papers/<paper>.py with the scale flags below, a
`fineflax.rl.learner.Learner` (train.params="full", f32 master params and AdamW moments split over fsdp =
all devices, `pin_state`, the `UpdatePlan` of rl.mini_batch_size / rl.micro_batch_tokens and PPO's critic)
whose model comes from `random_model` instead of a checkpoint (N(0, 0.02) weights of the hub shape
`fineflax.models.hub_shapes`, each leaf made in its fsdp place: `benchmarks.scaling.random_params`;
SmolLM2's tokenizer, shipped with the package).

  luffy           Elliott/Qwen2.5-Math-7B-16k-think shape, rl.objective="luffy". P prompts (random ids) x G
                  rows: G-1 sampled by the learner's policy + 1 off-policy trace (random ids). Response
                  lengths log-normal (median --median, sigma --sigma, cap --max-new-tokens:
                  `benchmarks.engine.response_lengths`); the policy decodes max(lengths) steps and each row
                  is cut at its drawn length with EOS forced there. On a mesh the sampler is the static
                  session, whose cost is max(lengths) steps for every row whatever the per-row ends, so this
                  costs what per-row stops would. Rewards: random 0/1 (seed 0).
  search_r1_ppo   Qwen/Qwen2.5-7B shape, configs/papers/search_r1.py:ppo (critic "full" or "lora" by --critic):
                  the search_r1 environment's multi-turn rollouts (`SearchR1Env.rollout`: up to
                  search.max_turns + 1 turns of search.max_turn_tokens, an in-process bm25 search over the
                  generated knowledge base), rewards `search_r1_reward` (exact match). A random model rarely
                  writes a well-formed <search>: the turns column says how many turns and searches ran.

rollout s = the sampler and the rows; update s = the batch, the old / reference / value log-probs and every
optimizer step of the plan (`Learner.update`), host-synchronised. Step 1 includes compilation; with
--steps 2 the table reports the last step (compiled). Projected hours for the paper's run:
    hours = N x (rollout s + update s) x (B x G_paper) / (P x G) x (d / D) / 3600
(N steps at B prompts x G_paper rows on D GPUs; P x G rows measured on d devices): linear in rows and
inverse in devices, the same lengths as measured. Decoding more rows per step costs less than linearly,
so it is an upper bound for the rollout part.
Results: DIR/paper_scale.md and DIR/paper_scale.json after each recipe; --results writes RESULTS.md too.
"""
from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import os
import pathlib
import sys
import time
from unittest import mock

from benchmarks import gpu
from benchmarks._results import markdown_table, write_section
from fineflax.io import atomic_write_text

# The papers' runs (the configs' values): steps, prompts a step, rows a prompt, GPUs of 80 GB.
PAPER = {"luffy": dict(steps=500, prompts=128, group=8, gpus=8, model="Elliott/Qwen2.5-Math-7B-16k-think",
                       setup="LUFFY: 500 steps x 128 prompts x 8 rows (7 + 1 trace), responses <= 8192, 8 x 80 GB"),
         "search_r1_ppo": dict(steps=1005, prompts=512, group=5, gpus=8, model="Qwen/Qwen2.5-7B",
                               setup="Search-R1 PPO: 1005 steps x 512 prompts x 5 rollouts, 8 x 80 GB")}
GPU_DEFAULTS = {"luffy": dict(prompts=16, samples=8, median=1024, sigma=1.0, max_new_tokens=4096, prompt_len=512,
                              micro_batch_tokens=32768),
                "search_r1_ppo": dict(prompts=32, samples=5, micro_batch_tokens=8 * (2048 + 2500))}
TINY_DEFAULTS = {"luffy": dict(prompts=2, samples=4, median=8, sigma=1.0, max_new_tokens=16, prompt_len=8,
                               micro_batch_tokens=64),
                 "search_r1_ppo": dict(prompts=2, samples=2, micro_batch_tokens=1024)}
TINY_SHAPE = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, vocab_size=49152)
TINY_DEVICES = 2
SHAPE_FIELDS = ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads", "num_kv_heads")
COLUMNS = ["recipe", "model shape", "devices", "rows (P x G)", "scale vs paper", "response tokens (mean / max)",
           "turns / searches a row", "rollout s", "update s", "first step s (rollout / update)",
           "peak GiB / device", "loss", "projected h (paper run)"]
JSON_FIELDS = ("recipe", "devices", "rows", "scale", "rollout_s", "update_s", "first_rollout_s",
               "first_update_s", "peak_gib", "projected_h", "formula")


# ----------------------------------------------------------------------------- worker (one recipe)

def paper_config(spec: dict):
  """The paper's ConfigDict with this run's scale: P prompts x G rows, mini-batches of P/2 prompts (both
  papers take 2 optimizer steps a rollout batch), rl.micro_batch_tokens; tiny: short turns and lengths."""
  r = spec["recipe"]
  if r == "luffy":
    from configs.papers import luffy
    config = luffy.get_config()
    config.rl.max_new_tokens = spec["max_new_tokens"]
    config.plan.prompt_tokens = spec["prompt_len"]
  else:
    from configs.papers import search_r1
    config = search_r1.get_config("ppo")
    config.model.source = PAPER[r]["model"]
    config.rl.ppo.critic = spec["critic"]
    config.search.url = ""  # the in-process engine over the generated knowledge base
    if spec["tiny"]:
      s = config.search
      s.max_turn_tokens, s.max_obs_tokens = 8, 32
      config.rl.max_new_tokens = (s.max_turns + 1) * s.max_turn_tokens + s.max_turns * s.max_obs_tokens
  rl = config.rl
  rl.prompts_per_step, rl.group_size = spec["prompts"], spec["samples"]
  rl.mini_batch_size = spec["prompts"] // 2 if spec["prompts"] % 2 == 0 else spec["prompts"]
  rl.micro_batch_tokens = spec["micro_batch_tokens"]
  if spec.get("model_source"):  # --fit: a smaller shape when the paper's fits at no P (`_paper_fit`)
    config.model.source = spec["model_source"]
  return config


def random_model(config, mesh, tiny: bool):
  """`setup_model`'s (base, model config, tokenizer, lora cfg, lora) with random weights of the hub shape
  of config.model.source (tiny: its widths shrunk to TINY_SHAPE), made in place on `mesh`."""
  from benchmarks.scaling import random_params
  from fineflax import lora as lora_lib
  from fineflax.models import ModelConfig
  from fineflax.models.hub_shapes import hub_config
  from fineflax.models.layer_loop import resolve_layer_loop
  from fineflax.models.load import load_tokenizer
  from fineflax.train.model_setup import compute_dtype
  hub, tok = hub_config(config.model.source), load_tokenizer("smollm2-135m-instruct")
  if tiny:  # the hub's special ids are past the tiny vocabulary: the tokenizer's
    hub = dict(hub, **TINY_SHAPE, eos_token_id=tok.eos_token_id, bos_token_id=tok.eos_token_id)
  mc = ModelConfig.from_hf(hub, source=f"random {config.model.source}")
  mc = dataclasses.replace(mc, attention=config.model.get("attention", "auto"),
                           layer_loop=resolve_layer_loop(config.model.get("layer_loop", "scan"), config.model.remat))
  base = random_params(mc, mesh, compute_dtype(config), "none")
  return base, mc, tok, lora_lib.LoraConfig.from_mapping(config.lora), None


def make_learner(config):
  """A `Learner` of `config` on the mesh fsdp = every device, its model from `random_model`."""
  import jax
  from fineflax.mesh import make_mesh
  from fineflax.rl import learner as learner_lib
  from fineflax.rl.config import RLConfig
  mesh = make_mesh(data=1, fsdp=jax.device_count())
  tiny = jax.default_backend() == "cpu"
  with mock.patch.object(learner_lib, "setup_model", lambda c, model=None: random_model(c, mesh, tiny)):
    return learner_lib.Learner(config, RLConfig.from_config(config.rl), mesh=mesh)


def luffy_rollout(learner, state, spec: dict, step: int):
  """(rows, rewards, stats): per group G-1 policy samples and 1 random trace, cut at long-tail lengths."""
  import jax
  import numpy as np
  from benchmarks.engine import response_lengths
  from fineflax.rl import rows as R
  P, G, vocab = spec["prompts"], spec["samples"], len(learner.tok)
  rng = np.random.default_rng(step)
  prompts = rng.integers(3, vocab, (P, spec["prompt_len"])).tolist()
  lengths = np.array(response_lengths(P * G, spec["median"], spec["max_new_tokens"], spec["sigma"], seed=step))
  on_len, off_len = lengths[:P * (G - 1)].reshape(P, G - 1), lengths[P * (G - 1):]
  policy = dataclasses.replace(learner.policy(state["params"]), max_new_tokens=int(on_len.max()))
  on_prompts = [p for p in prompts for _ in range(G - 1)]
  out = policy.sample(on_prompts, rng=jax.random.PRNGKey(step))
  eos = policy.eos_id
  groups = R.empty_rows()
  for g in range(P):
    comps, logps = [], []
    for j in range(G - 1):
      i, n = g * (G - 1) + j, int(on_len[g, j])
      n = min(n, int(out.lengths[i]))
      comps.append(out.tokens[i, :n - 1].tolist() + [eos])  # EOS forced at the drawn length
      logps.append(out.logprobs[i, :n].tolist())
    R.extend(groups, R.make_rows([prompts[g]] * (G - 1), comps, [[1.0] * len(c) for c in comps], [""] * len(comps),
                                 off_policy=False, rollout_logp=logps))
    trace = rng.integers(3, vocab, int(off_len[g]) - 1).tolist() + [eos]
    R.extend(groups, R.make_rows([prompts[g]], [trace], [[1.0] * len(trace)], [""], off_policy=True))
  rewards = rng.integers(0, 2, P * G).astype(np.float32)
  tokens = [len(c) for c in groups["completion"]]
  return groups, rewards, dict(mean_tokens=float(np.mean(tokens)), max_tokens=int(max(tokens)), turns=None,
                               searches=None)


def search_r1_rollout(learner, state, spec: dict, step: int, env):
  """(rows, rewards, stats): the search_r1 env's multi-turn rollouts of P questions x G, EM rewards."""
  import jax
  import numpy as np
  from fineflax.search_r1.rewards import search_r1_reward
  P, G = spec["prompts"], spec["samples"]
  items = [env.train_items[(step * P + i) % len(env.train_items)] for i in range(P) for _ in range(G)]
  rows, examples = env.rollout(learner.policy(state["params"]), items, jax.random.PRNGKey(step))
  results = [e["rollout"] for e in examples]
  rewards = np.array([search_r1_reward(r, e["answer"])[0] for r, e in zip(results, examples)], np.float32)
  tokens = [len(c) for c in rows["completion"]]
  return rows, rewards, dict(mean_tokens=float(np.mean(tokens)), max_tokens=int(max(tokens)),
                             turns=float(np.mean([r.num_turns for r in results])),
                             searches=float(np.mean([len(r.queries) for r in results])))


def run_recipe(spec: dict) -> dict:
  """One recipe's steps in this process -> measured seconds, peak memory, lengths (module docstring)."""
  import jax
  import numpy as np
  from benchmarks.scaling import _peak_gib
  from fineflax.rl.collect import Groups
  t0, fit_notes = time.perf_counter(), []
  if spec.get("fit"):
    from benchmarks._paper_fit import fit_spec
    limit = (jax.devices()[0].memory_stats() or {}).get("bytes_limit")
    if limit is None:
      raise RuntimeError("--fit needs the device's bytes_limit (a GPU)")
    spec, fit_notes = fit_spec(spec, paper_config, jax.device_count(), float(limit))
    for line in fit_notes:
      print(f"[paper_scale] fit: {line}", file=sys.stderr, flush=True)
    if spec is None:
      raise RuntimeError("no shape fits: " + " | ".join(fit_notes))
  config = paper_config(spec)
  learner = make_learner(config)
  env = None
  if spec["recipe"] == "search_r1_ppo":
    from fineflax.envs.search_r1 import SearchR1Env
    env = SearchR1Env(config, learner.tok)
  jax.block_until_ready(learner.state)
  setup_s = time.perf_counter() - t0
  state, steps = learner.state, []
  for step in range(spec["steps"]):
    t = time.perf_counter()
    if env is None:
      rows, rewards, stats = luffy_rollout(learner, state, spec, step)
    else:
      rows, rewards, stats = search_r1_rollout(learner, state, spec, step, env)
    t_roll = time.perf_counter()
    gc.collect()  # the rollout's sessions and caches go before the update allocates
    mem = {"in_use_after_rollout_gib": (gpu.jax_bytes_in_use() or 0) / gpu.GIB,
           "peak_rollout_gib": (gpu.jax_peak_bytes() or 0) / gpu.GIB}
    print(f"[paper_scale] memory after the rollout: {mem}", file=sys.stderr, flush=True)
    t_update = time.perf_counter()  # the collection and the memory query belong to neither phase
    P = spec["prompts"]
    batch = learner.groups_batch(Groups(rows=rows, rewards=rewards, idx=list(range(P)),
                                        zero_var=np.zeros(P, bool)))
    state, metrics = learner.update(state, batch)
    jax.block_until_ready(state)
    steps.append(dict(stats, **mem, rollout_s=t_roll - t, update_s=time.perf_counter() - t_update,
                      loss=float(metrics["loss"]), rows=len(rows["completion"])))
    print(f"[paper_scale] {spec['recipe']} step {step}: {steps[-1]}", file=sys.stderr, flush=True)
    if not np.isfinite(steps[-1]["loss"]):
      raise FloatingPointError(f"loss is {steps[-1]['loss']}")
  return {"steps": steps, "setup_s": setup_s, "devices": jax.device_count(), "peak_gib": _peak_gib(),
          "spec": spec, "fit": fit_notes,
          "device": gpu.jax_device_name(), "shape": {k: getattr(learner.model_config, k) for k in SHAPE_FIELDS},
          "metrics": {k: float(v) for k, v in metrics.items()}}


# ----------------------------------------------------------------------------- driver

def summarize(spec: dict, res: dict) -> dict:
  """The row of a finished recipe: last step's seconds, the first's, the projection and its formula."""
  spec = res.get("spec", spec)  # --fit: the prompts and shape the worker chose
  paper, last, first = PAPER[spec["recipe"]], res["steps"][-1], res["steps"][0]
  rows, d = spec["prompts"] * spec["samples"], res["devices"]
  scale = paper["prompts"] * paper["group"] / rows
  step_s = last["rollout_s"] + last["update_s"]
  hours = paper["steps"] * step_s * scale * d / paper["gpus"] / 3600
  formula = (f"{paper['steps']} steps x {step_s:.1f} s x ({paper['prompts']} x {paper['group']}) / ({spec['prompts']} x "
             f"{spec['samples']}) x ({d} / {paper['gpus']}) / 3600")
  return dict(recipe=spec["recipe"], devices=d, rows=rows, scale=scale, rollout_s=last["rollout_s"],
              update_s=last["update_s"], first_rollout_s=first["rollout_s"], first_update_s=first["update_s"],
              peak_gib=res.get("peak_gib"), projected_h=hours, formula=formula, paper_setup=paper["setup"],
              mean_tokens=last["mean_tokens"], max_tokens=last["max_tokens"], turns=last["turns"],
              searches=last["searches"], loss=last["loss"], model=spec.get("model_source") or paper["model"],
              spec=spec, fit=res.get("fit", []), result=res)


def table_row(r: dict) -> list:
  if "error" in r:
    return [r["recipe"], PAPER[r["recipe"]]["model"], "", "", "", "", "", "", "", "", "", "",
            "error: " + r["error"][:200].replace("|", "/")]
  s = r["spec"]
  turns = "-" if r["turns"] is None else f"{r['turns']:.2f} / {r['searches']:.2f}"
  return [r["recipe"], r["model"] + (" (tiny widths)" if s["tiny"] else ""), r["devices"],
          f"{r['rows']} ({s['prompts']} x {s['samples']})", f"1/{r['scale']:.3g}",
          f"{r['mean_tokens']:.0f} / {r['max_tokens']}", turns, round(r["rollout_s"], 2), round(r["update_s"], 2),
          f"{r['first_rollout_s']:.1f} / {r['first_update_s']:.1f}",
          "n/a" if r["peak_gib"] is None else round(r["peak_gib"], 2), r["loss"], f"{r['projected_h']:.3g}"]


def report(rows: list[dict], device: str, command: str, tiny: bool) -> str:
  lines = ["## paper_scale: the papers' full-parameter RL steps at their model shapes (issue 31)" +
           (" — TINY (CPU)" if tiny else ""), "",
           f"Device: {device}. Command: `{command}`.", "",
           "Random weights of the published shapes, train.params=full (f32 master params, AdamW moments split "
           "over fsdp = all devices), the papers' configs (configs/papers/) at the P x G shown; one `Learner` "
           "step: rollout (the learner's policy; search_r1: the env's multi-turn rollouts with in-process "
           "bm25 search) and update (`Learner.update`: UpdatePlan with 2 mini-batches of micro-batches of "
           "rl.micro_batch_tokens). Seconds of the last step (the first compiles); peak GiB = the largest "
           "device's peak. scale = measured rows / the paper's rows a step.", "",
           markdown_table(COLUMNS, [table_row(r) for r in rows]), "",
           "Projected hours = N x (rollout s + update s) x (B x G_paper) / (P x G) x (d / D) / 3600 "
           "(linear in rows, inverse in devices, the measured lengths; an upper bound for the rollout):"]
  lines += [f"- {r['recipe']}: {r['formula']} = **{r['projected_h']:.3g} h**; paper setup: {r['paper_setup']}."
            + "".join(f" Fit (--fit): {n}." for n in r.get("fit", []))
            for r in rows if "error" not in r]
  return "\n".join(lines)


def write_outputs(out_dir: pathlib.Path, rows: list[dict], device: str, command: str, tiny: bool,
                  results: bool) -> str:
  md = report(rows, device, command, tiny)
  out_dir.mkdir(parents=True, exist_ok=True)
  atomic_write_text(out_dir / "paper_scale.md", md + "\n")
  atomic_write_text(out_dir / "paper_scale.json", json.dumps({"device": device, "command": command, "tiny": tiny,
                                                              "rows": rows}, indent=1))
  if results:
    write_section("paper_scale", md)
  return md


def earlier_rows(out_dir: pathlib.Path, recipes, tiny: bool) -> list[dict]:
  """The rows of DIR/paper_scale.json of other recipes (same --tiny), so one call per recipe adds up."""
  path = out_dir / "paper_scale.json"
  if not path.exists():
    return []
  data = json.loads(path.read_text())
  return [r for r in data["rows"] if r["recipe"] not in recipes] if data.get("tiny") == tiny else []


def specs(args) -> list[dict]:
  out = []
  for recipe in args.recipe:
    d = dict((TINY_DEFAULTS if args.tiny else GPU_DEFAULTS)[recipe])
    for k in d:
      if getattr(args, k, None) is not None:
        d[k] = getattr(args, k)
    out.append(dict(d, recipe=recipe, tiny=args.tiny, steps=args.steps, critic=args.critic,
                    fit=getattr(args, "fit", False)))
  return out


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--recipe", nargs="+", choices=tuple(PAPER), default=list(PAPER))
  p.add_argument("--tiny", action="store_true", help=f"tiny widths on {TINY_DEVICES} forced CPU devices")
  p.add_argument("--prompts", type=int, help="P prompts a step (default: luffy 16, search_r1_ppo 32)")
  p.add_argument("--samples", type=int, help="G rows a prompt (luffy: G-1 sampled + 1 trace; default 8 / 5)")
  p.add_argument("--median", type=int, help="luffy: median response tokens (default 1024)")
  p.add_argument("--sigma", type=float, help="luffy: log-normal sigma of the lengths (default 1.0)")
  p.add_argument("--max-new-tokens", type=int, help="luffy: the length cap (default 4096; the paper's 8192)")
  p.add_argument("--prompt-len", type=int, help="luffy: prompt tokens (default 512)")
  p.add_argument("--micro-batch-tokens", type=int, help="rl.micro_batch_tokens (default the paper's)")
  p.add_argument("--critic", choices=("full", "lora"), default="full", help="search_r1_ppo: the critic")
  p.add_argument("--fit", action="store_true",
                 help="run the most prompts (<= --prompts) the memory plan fits on the visible devices, a smaller "
                      "model shape when the paper's fits at none (benchmarks/_paper_fit.py; JAX may use 95%% of each GPU)")
  p.add_argument("--steps", type=int, default=1, help="RL steps; the table shows the last (default 1)")
  p.add_argument("--budget", type=float, default=450.0,
                 help="seconds for all recipes; each gets what is left (default 450: an 8-minute device call)")
  p.add_argument("--results", action="store_true", help="also write the paper_scale section of RESULTS.md")
  p.add_argument("--out", default=str(pathlib.Path(__file__).with_name("out") / "paper_scale"))
  p.add_argument("--worker", help=argparse.SUPPRESS)
  args = p.parse_args(argv)
  if args.worker:
    gpu.print_result(run_recipe(json.loads(args.worker)))
    return 0
  command = "python -m benchmarks.paper_scale " + " ".join(argv if argv is not None else sys.argv[1:])
  device = f"CPU, {TINY_DEVICES} forced host devices" if args.tiny else gpu.device_name()
  env = (gpu.jax_env(JAX_PLATFORMS="cpu", XLA_FLAGS=f"--xla_force_host_platform_device_count={TINY_DEVICES}")
         if args.tiny else gpu.jax_env(**({"XLA_PYTHON_CLIENT_MEM_FRACTION": "0.95"} if args.fit else {})))
  out_dir, t_all = pathlib.Path(args.out), time.perf_counter()
  rows, md = earlier_rows(out_dir, args.recipe, args.tiny), ""
  for spec in specs(args):
    t = time.perf_counter()
    left = args.budget - (t - t_all)
    res = ({"error": f"not run: {left:.0f} s of the {args.budget:.0f} s budget left"} if left < 30 else
           gpu.run_worker([*gpu.worker_argv(__spec__.name), "--worker", json.dumps(spec)], env=env, timeout=left))
    rows.append(dict(recipe=spec["recipe"], spec=spec, **res) if "error" in res else summarize(spec, res))
    print(f"[paper_scale] {spec['recipe']}: {time.perf_counter() - t:.0f} s wall", file=sys.stderr, flush=True)
    md = write_outputs(out_dir, rows, device, command.strip(), args.tiny, args.results)
  print(md)
  return 0 if all("error" not in r for r in rows) else 1


if __name__ == "__main__":
  sys.exit(main())
