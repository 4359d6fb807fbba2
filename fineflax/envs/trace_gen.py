"""Off-policy traces for the generated arithmetic tasks: from the step-by-step solver or from a model.

  python -m fineflax.envs.trace_gen --out traces.jsonl --n 2000                       # solver traces
  python -m fineflax.envs.trace_gen --out traces.jsonl --n 500 --model ORG/BIGGER-MODEL --samples 4

Model traces are sampled with the task's system prompt, scored with `reward` (default
math_last_number) and only those reaching `min_reward` are kept (at most one per question). Output is
LUFFY's JSONL format (prompt messages, target message, reward_model.ground_truth), atomically written.
"""
from __future__ import annotations

import argparse
from typing import Sequence

from fineflax.envs.word_problems import Problem, generate_problems, write_traces
from fineflax.rl.traces import write_luffy_jsonl

DEFAULT_SYSTEM_PROMPT = ("Solve the word problem step by step. End with the final number, like: "
                         "The answer is 42.")


def model_traces(source: str, problems: Sequence[Problem], *, samples: int = 4, temperature: float = 0.7,
                 max_new_tokens: int = 256, system_prompt: str = DEFAULT_SYSTEM_PROMPT,
                 reward: str = "math_last_number", min_reward: float = 1.0, batch_size: int = 64,
                 seed: int = 0) -> list[tuple[Problem, str]]:
  """(problem, response) for problems where one of `samples` sampled responses scores >= min_reward."""
  import jax
  from tqdm import tqdm
  from fineflax.models import load
  from fineflax.models.dtype import resolve_dtype
  from fineflax.rewards import score_completions
  from fineflax.sampling import chat_prompt_ids, generate
  params, config, tok = load(source, dtype=resolve_dtype("auto"))
  kept, rng = [], jax.random.PRNGKey(seed)
  for i in tqdm(range(0, len(problems), batch_size), desc="traces"):
    chunk = problems[i:i + batch_size]
    prompts = [chat_prompt_ids(tok, [{"role": "system", "content": system_prompt},
                                     {"role": "user", "content": p.question}]) for p in chunk for _ in range(samples)]
    rng, key = jax.random.split(rng)
    out = generate(params, config, prompts, max_new_tokens=max_new_tokens, temperature=temperature,
                   tokenizer=tok, rng=key)
    total, _, _ = score_completions({reward: 1.0}, [p.question for p in chunk for _ in range(samples)],
                                    out.texts, [{"answer": str(p.answer)} for p in chunk for _ in range(samples)])
    for j, p in enumerate(chunk):
      good = [out.texts[j * samples + s] for s in range(samples) if total[j * samples + s] >= min_reward]
      if good:
        kept.append((p, good[0]))
  return kept


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--out", required=True, help="output .jsonl")
  ap.add_argument("--n", type=int, default=1000, help="training problems")
  ap.add_argument("--steps", type=int, nargs=2, default=(1, 5), metavar=("LO", "HI"), help="operations")
  ap.add_argument("--seed", type=int, default=0)
  ap.add_argument("--model", default="", help="stronger model (HF folder, .gguf, hub name); default: solver")
  ap.add_argument("--samples", type=int, default=4, help="samples per question (model traces)")
  ap.add_argument("--temperature", type=float, default=0.7)
  args = ap.parse_args(argv)
  problems = generate_problems(args.n, "train", tuple(args.steps), args.seed)
  if args.model:
    rows = model_traces(args.model, problems, samples=args.samples, temperature=args.temperature,
                        seed=args.seed)
    path = write_luffy_jsonl(args.out, [(p.question, r, p.answer, {"num_steps": p.num_steps})
                                        for p, r in rows], data_source=f"model:{args.model}")
  else:
    path, rows = write_traces(args.out, problems), problems
  print(f"wrote {len(rows)} traces to {path}")


if __name__ == "__main__":
  main()
