"""APO job: optimise the calculator agent's system prompt by beam search with textual gradients
(`fineflax.agents.apo`), then score the seed and the best prompt on held-out test problems.

The agent samples from the in-process model (`config.model`, plus `model.adapter` when set); the critic and
the editor are OpenAI-compatible endpoints (`apo.critic.url` / `apo.editor.url`, e.g. this project's server or
vLLM) or, when the URL is "", the same in-process model. Tasks: `task.num_train` gradient problems and
`task.num_val` validation problems (disjoint, train split), `task.num_test` test problems (held-out split).
Candidates are scored with greedy decoding (the agent samples at `agent.temperature` only for the rollouts
the critic reads); validation and test accuracy of the seed and the best prompt are both greedy.
Writes WORKDIR/apo_result.json, WORKDIR/candidates.jsonl and the store WORKDIR/agent_store.sqlite (the best
prompt is a new version of its resource "prompt_template").
"""
from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import os
import time

import jax
import numpy as np

from fineflax.agents import LocalLLM, OpenAILLM, Store, run_rollouts
from fineflax.agents.apo import APOSettings, apo
from fineflax.agents.calculator import CalculatorAgent, calculator_tasks
from fineflax.config_checks import in_range, positive_int, require
from fineflax.envs.word_problems import generate_problems
from fineflax.io import atomic_write_text
from fineflax.jobs import resolve
from fineflax.rl.policy import Policy
from fineflax.train.model_setup import compute_dtype
from fineflax.train.workdir import make_workdir

SETTINGS = ("val_batch_size", "gradient_batch_size", "beam_width", "branch_factor", "beam_rounds")
EXTRA = ("min_prompt_chars", "max_prompt_chars", "required", "time_budget_s")  # APOSettings beyond AGL's


def validate(config) -> None:
  for key in [f"apo.{k}" for k in SETTINGS] + ["task.num_train", "task.num_val", "task.num_test",
                                                "agent.max_calls", "agent.num_workers", "agent.max_new_tokens"]:
    positive_int(config, key)
  in_range(config, "agent.temperature", 0.0, float("inf"))
  in_range(config, "apo.time_budget_s", 0.0, float("inf"))
  require(config, "agent.prompt_template", lambda v: isinstance(v, str) and v.strip(), "a non-empty string")
  require(config, "apo.val_batch_size", lambda v: v <= config.task.num_val,
          f"at most task.num_val={config.task.num_val}")


def load_policy(config) -> Policy:
  """Base (quantised per `model.quant`; + the adapter `model.adapter`, if set) with the agent's sampling
  settings."""
  from fineflax import lora as lora_lib
  from fineflax.models import load
  dtype = compute_dtype(config)
  params, mc, tok = load(config.model.source, dtype=dtype, quant=config.model.quant,
                         quant_targets=tuple(config.model.quant_targets))
  lora, scale = None, 1.0
  if config.model.get("adapter", ""):
    lora, lora_cfg = lora_lib.import_peft(config.model.adapter, mc)
    scale = lora_lib.lora_scale(lora_cfg)
  a = config.agent
  return Policy(params, mc, tok, lora, scale, dtype, a.temperature, 1.0, a.max_new_tokens)


def make_client(section, local, rng):
  """An OpenAI-compatible client for `section.url`, or the in-process model with the section's settings."""
  if section.url:
    return OpenAILLM(section.url, section.model, temperature=section.temperature, max_tokens=section.max_tokens)
  return LocalLLM(dataclasses.replace(local, temperature=section.temperature, max_new_tokens=section.max_tokens), rng)


def tasks(config):
  t = config.task
  sizes = dict(max_start=t.max_start, max_addend=t.max_addend)
  train = calculator_tasks(generate_problems(t.num_train + t.num_val, "train", tuple(t.num_steps), config.seed, **sizes))
  test = calculator_tasks(generate_problems(t.num_test, "test", tuple(t.num_steps), t.eval_seed, **sizes))
  return train[:t.num_train], train[t.num_train:], test


def accuracy(agent, prompt, tasks_, llm, store, workers) -> float:
  recs = run_rollouts(agent, tasks_, llm, {"prompt_template": prompt}, store, num_workers=workers, mode="test")
  return float(np.mean([r.reward or 0.0 for r in recs]))


def run(config, workdir: str | None) -> dict:
  resolve.validate(config)  # the one pass (this job's `validate` is part of it)
  workdir = make_workdir(config, workdir)
  policy = load_policy(config)
  rng = jax.random.PRNGKey(config.seed)
  a = config.agent
  llm = LocalLLM(policy, jax.random.fold_in(rng, 0))
  critic = make_client(config.apo.critic, policy, jax.random.fold_in(rng, 1))
  editor = make_client(config.apo.editor, policy, jax.random.fold_in(rng, 2))
  store = Store(os.path.join(workdir, "agent_store.sqlite"))
  agent = CalculatorAgent(a.max_calls)
  train, val, test = tasks(config)
  settings = APOSettings(**{k: config.apo[k] for k in SETTINGS + EXTRA}, seed=config.seed)
  greedy = CalculatorAgent(a.max_calls, temperature=0.0)
  t0 = time.time()
  result = apo(agent, a.prompt_template, train, val, llm, critic, editor, store, settings,
               num_workers=a.num_workers, eval_agent=greedy)
  search_s = time.time() - t0
  atomic_write_text(os.path.join(workdir, "candidates.jsonl"),  # the search's log, before the test runs
                    "".join(json.dumps(dataclasses.asdict(c)) + "\n" for c in result.candidates))
  prompts = [a.prompt_template] + ([result.best.prompt] if result.best.id else [])
  with concurrent.futures.ThreadPoolExecutor(2) as pool:  # both test runs at once: the sampler batches them
    accs = list(pool.map(lambda p: accuracy(greedy, p, test, llm, store, a.num_workers), prompts))
  seed_test, best_test = accs[0], accs[-1]
  out = {"seed_prompt": a.prompt_template, "best_prompt": result.best.prompt, "best_id": result.best.id,
         "best_val": result.best_score, "seed_val": result.candidates[0].scores["round 0 full val"],
         "seed_test_greedy": seed_test, "best_test_greedy": best_test,
         "rounds_done": len(result.history) - 1, "search_s": search_s, "test_s": time.time() - t0 - search_s,
         "num_candidates": len(result.candidates) - 1,
         "num_rejected": sum(bool(c.rejected) for c in result.candidates),
         "candidates": [dataclasses.asdict(c) for c in result.candidates],
         "history": result.history, "resource_version": result.version,
         "split": {"gradient": len(train), "val": len(val), "test": len(test)}}
  atomic_write_text(os.path.join(workdir, "apo_result.json"), json.dumps(out, indent=1))
  for client in (llm, critic, editor):
    if hasattr(client, "close"):
      client.close()
  print(f"APO: val {out['seed_val']:.3f} -> {out['best_val']:.3f}; test (greedy) {out['seed_test_greedy']:.3f} -> "
        f"{out['best_test_greedy']:.3f}; {workdir}/apo_result.json", flush=True)
  return {"workdir": workdir, "result": out, "exit_code": 0, "summary": out}
