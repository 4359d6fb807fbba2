"""Pieces of the adaptation-loop experiment: the arithmetic questions and their splits, the label-noised
training set of the weak variant, the server subprocess, the simulated users and the routing metrics.

Questions are "What is a op b?" with op in {+, -}, a in 61..99, b in 2..40 (a - b >= 0): the first operand
range of the bundled eval set (`fineflax/data/samples/arithmetic_eval_messages.jsonl`), disjoint from the
bundled training chats (a <= 60) the variants are tuned on. The users' questions and the held-out eval
questions are two disjoint slices of one shuffled list of distinct questions.
"""
from __future__ import annotations

import concurrent.futures as cf
import json
import os
import pathlib
import random
import threading
import time
import urllib.request

import numpy as np

from fineflax.serve.spawn import spawn_server

ROOT = pathlib.Path(__file__).resolve().parents[2]
BUNDLED_TRAIN = ROOT / "fineflax" / "data" / "samples" / "arithmetic_messages.jsonl"


def make_questions(n: int, seed: int) -> list[dict]:
  """n distinct {"question", "answer" (str), "equation"} in a seeded random order (n <= 3042)."""
  pool = [(a, op, b) for a in range(61, 100) for b in range(2, 41) for op in "+-"]
  if n > len(pool):
    raise ValueError(f"{n} questions asked; only {len(pool)} distinct ones exist")
  random.Random(seed).shuffle(pool)
  out = []
  for a, op, b in pool[:n]:
    c = a + b if op == "+" else a - b
    out.append({"question": f"What is {a} {op} {b}?", "answer": str(c), "equation": f"{a} {op} {b} = {c}"})
  return out


def eval_rows(questions: list[dict]) -> list[dict]:
  """Rows of `fineflax.evals`: the question, `answer` (the number, for math_last_number) and
  `golden_answers` (the equation or the bare number, for exact_match_lenient)."""
  return [{"question": q["question"], "answer": q["answer"], "golden_answers": [q["equation"], q["answer"]]}
          for q in questions]


def noisy_chats(seed: int, src: pathlib.Path = BUNDLED_TRAIN) -> list[dict]:
  """The bundled arithmetic chats with every assistant result shifted by d ~ U{-9..9} \\ {0}: the
  "fine-tune on buggy labels" that makes the weak variant (its answers keep the format, not the value)."""
  rng = random.Random(seed)
  rows = []
  for line in src.read_text().splitlines():
    row = json.loads(line)
    for m in row["messages"]:
      if m["role"] == "assistant":
        lhs, rhs = m["content"].rstrip(".").rsplit(" = ", 1)
        m["content"] = f"{lhs} = {int(rhs) + rng.choice([d for d in range(-9, 10) if d])}."
    rows.append(row)
  return rows


def write_jsonl(path, rows) -> None:
  from fineflax.io import atomic_write_text
  atomic_write_text(path, "".join(json.dumps(r) + "\n" for r in rows))


def free_port() -> int:
  import socket
  with socket.socket() as sock:
    sock.bind(("127.0.0.1", 0))
    return sock.getsockname()[1]


def env_with_root(cache_dir=None) -> dict:
  """The environment of the subprocesses: this checkout first on PYTHONPATH and, with `cache_dir`, JAX's
  persistent compilation cache there (the SFT runs and the eval variants compile the same programs)."""
  env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
  if cache_dir:
    env.update(JAX_COMPILATION_CACHE_DIR=str(cache_dir), JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
               JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="-1")
  return env


def start_server(argv: list[str], log_path, timeout: float = 900.0, cache_dir=None):
  """`python -m fineflax.serve argv` (output to log_path); returns (Popen, base URL) once /health answers."""
  return spawn_server(argv, env=env_with_root(cache_dir), log_path=log_path, cwd=ROOT, timeout=timeout,
                      poll_s=0.5)


def post_json(url: str, body: dict) -> dict:
  req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                               headers={"Content-Type": "application/json"})
  with urllib.request.urlopen(req, timeout=60) as r:
    return json.loads(r.read())


def get_json(url: str) -> dict:
  with urllib.request.urlopen(url, timeout=60) as r:
    return json.loads(r.read())


def reward_of(answer: str, reference: str) -> float:
  """The users' verdict: the registry's `math_last_number` (1 iff the reply's last number is the result)."""
  from fineflax.rewards import score_completions
  _, per_fn, _ = score_completions({"math_last_number": 1.0}, [""], [answer], [{"answer": reference}])
  return float(per_fn["math_last_number"][0])


def simulate_users(url: str, questions: list[dict], *, users: int, max_tokens: int) -> list[dict]:
  """`users` threads, each with its own `openai` client, take the next question, ask model="auto"
  (greedy), score the reply and POST the reward to /feedback. Returns one record per request in the order
  the feedback was acknowledged: {"k", "question", "variant", "answer", "reward", "tokens", "latency_s"}."""
  import openai
  lock, records, it = threading.Lock(), [], iter(questions)

  def user(_):
    client = openai.OpenAI(base_url=url + "/v1", api_key="none", timeout=600, max_retries=0)
    while True:
      with lock:
        q = next(it, None)
      if q is None:
        return
      t0 = time.time()
      r = client.chat.completions.create(model="auto", messages=[{"role": "user", "content": q["question"]}],
                                         max_tokens=max_tokens, temperature=0.0)
      answer = r.choices[0].message.content or ""
      reward = reward_of(answer, q["answer"])
      post_json(url + "/feedback", {"id": r.id, "reward": reward})
      with lock:
        records.append({"k": len(records), "question": q["question"], "variant": r.model, "answer": answer,
                        "reward": reward, "tokens": r.usage.completion_tokens, "latency_s": time.time() - t0})

  with cf.ThreadPoolExecutor(users) as ex:
    list(ex.map(user, range(users)))
  return records


def routing_metrics(records: list[dict], variants: list[str], last: int) -> dict:
  """Per variant: requests and mean reward; best = the variant of highest mean reward over the run.
  share_last = share of the last `last` requests routed to best; cumulative pseudo-regret after t requests
  = sum_{s <= t} (mean[best] - mean[variant_s]) with the run's empirical means (uniform routing's is
  t * (mean[best] - mean over variants)); rolling_share = share of best over a trailing window."""
  means = {}
  for v in variants:
    rs = [r["reward"] for r in records if r["variant"] == v]
    means[v] = float(np.mean(rs)) if rs else 0.0
  best = max(variants, key=lambda v: means[v])
  chosen_best = np.array([r["variant"] == best for r in records], float)
  gaps = np.array([means[best] - means[r["variant"]] for r in records])
  window = max(1, min(last, len(records)) // 2)
  rolling = [float(chosen_best[max(0, i + 1 - window):i + 1].mean()) for i in range(len(records))]
  tail = chosen_best[-last:] if records else chosen_best
  return {"variants": {v: {"requests": sum(r["variant"] == v for r in records), "mean_reward": means[v]}
                       for v in variants},
          "best": best, "last": int(min(last, len(records))), "share_last": float(tail.mean()) if len(tail) else 0.0,
          "share_all": float(chosen_best.mean()) if records else 0.0,
          "cumulative_regret": np.cumsum(gaps).tolist(),
          "uniform_regret_per_request": float(means[best] - np.mean(list(means.values()))),
          "rolling_window": window, "rolling_share": rolling}
