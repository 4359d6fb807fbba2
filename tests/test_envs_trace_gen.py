"""Trace generation: solver traces round-trip through load_traces; model traces keep only rewarded ones;
the LUFFY trainer takes its traces from a file."""
import jax

import pytest

from fineflax.envs import trace_gen
from fineflax.envs.word_problems import generate_problems
from fineflax.rl.traces import load_traces


@pytest.mark.fast
def test_solver_traces_round_trip(tmp_path):
  trace_gen.main(["--out", str(tmp_path / "t.jsonl"), "--n", "12", "--steps", "2", "3"])
  traces = load_traces(tmp_path / "t.jsonl")
  problems = generate_problems(12, "train", (2, 3), 0)
  assert [t.question for t in traces] == [p.question for p in problems]
  assert all(t.answer == str(p.answer) and t.response == p.solution for t, p in zip(traces, problems))


def test_model_traces_keep_only_rewarded_samples(tiny_smol):
  problems = generate_problems(3, "train", (1, 1), 0)
  kept = trace_gen.model_traces(tiny_smol, problems, samples=2, max_new_tokens=4, reward="format",
                                min_reward=0.0)
  assert [p for p, _ in kept] == problems  # min_reward 0: every question keeps its first sample
  assert trace_gen.model_traces(tiny_smol, problems, samples=2, max_new_tokens=4, reward="format",
                                min_reward=1.0) == []  # 4 random tokens never form <think>..<answer>


def test_luffy_job_reads_traces_from_a_file(tiny_smol, tmp_path):
  from fineflax.jobs import rl as rl_job
  from fineflax.jobs.resolve import load_config
  from fineflax.rl.collect import rollout_groups
  from fineflax.rl.traces import write_luffy_jsonl
  problems = generate_problems(2, "train", (1, 2), 0)
  write_luffy_jsonl(tmp_path / "t.jsonl", [(problems[0].question, "The answer is 7.", 7, {})], "test")
  c = load_config("configs/grpo_arith.py:smoke,luffy", [f"model.source={tiny_smol}", "rl.max_new_tokens=8",
                                                         f"rl.luffy.traces_path={tmp_path / 't.jsonl'}"])
  job = rl_job.RLJob(c)
  rows, _ = rollout_groups(job.env, job.learner.policy(None), problems, [None, None], jax.random.PRNGKey(0),
                           group_size=c.rl.group_size, guidance=job.guidance)
  K = c.rl.group_size
  assert rows["text"][:K].count("The answer is 7.") == 1 and sum(rows["off_policy"][:K]) == 1
  assert sum(rows["off_policy"][K:]) == 0 and len(rows["text"]) == 2 * K  # no trace: all on-policy
