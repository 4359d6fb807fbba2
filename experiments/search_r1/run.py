"""Search-R1 on a generated knowledge base: direct answering vs retrieve-once RAG vs Search-R1 training.

  python experiments/search_r1/run.py [--out experiments/search_r1/out] [--steps N] [--model SOURCE]
  python experiments/search_r1/run.py --smoke          # CPU: tiny KB and batches, one step

Held-out questions (half two-hop) about fictional entities: answers cannot be known without the corpus.
- direct: the base model answers inside <answer></answer> from the question alone;
- RAG: the top-3 BM25 passages of the question are put in the prompt (one retrieval);
- Search-R1: base + QLoRA trained by `fineflax.jobs.rl` on the search_r1 env (LUFFY demos by default), greedy,
  searching up to 4 times. Its step-0 evaluation (the untrained model in the Search-R1 loop) is listed too.
Writes results.json, training_curve.png and RESULTS.md (command, device, wall time) into --out.
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import jax  # noqa: E402
import numpy as np  # noqa: E402

from fineflax.jobs import rl as job  # noqa: E402
from fineflax.jobs.resolve import load_config  # noqa: E402
from fineflax.rewards.qa import extract_answer, normalize_answer  # noqa: E402
from fineflax.sampling import format_chat, generate  # noqa: E402
from fineflax.rewards.qa import exact_match_score  # noqa: E402
from fineflax.search_r1 import format_passages  # noqa: E402

DIRECT = ("Answer the given question. Give only the short answer inside <answer> and </answer>, for "
          "example <answer> Beijing </answer>. Question: {question}\n")
RAG = ("Answer the given question using the documents. Give only the short answer inside <answer> and "
       "</answer>, for example <answer> Beijing </answer>.\nDocuments:\n{docs}Question: {question}\n")


def answer_once(tr, questions, template, docs=None, max_new_tokens=32) -> list[str | None]:
  """Greedy single-turn answers of the base model (LoRA off); the <answer> content, else the whole text."""
  out = []
  for i in range(0, len(questions), tr.config.eval_batch_size):
    chunk = questions[i:i + tr.config.eval_batch_size]
    prompts = []
    for j, q in enumerate(chunk):
      text = template.format(question=q.question, docs=docs[i + j] if docs else "")
      chat = format_chat(tr.tok, [{"role": "user", "content": text}])
      prompts.append(tr.tok(chat, add_special_tokens=False)["input_ids"])
    res = generate(tr.base, tr.model_config, prompts, max_new_tokens=max_new_tokens, temperature=0.0,
                   tokenizer=tr.tok, stop_strings=("</answer>",), dtype=tr.dtype)
    out += [extract_answer(t) if extract_answer(t) is not None else t.strip() for t in res.texts]
  return out


def em_row(name, questions, answers, searches) -> dict:
  """EM per hop count, plus the lenient share of replies that contain the normalised gold answer."""
  em = np.array([exact_match_score(a, [q.answer]) for q, a in zip(questions, answers)])
  contains = np.array([normalize_answer(q.answer) in normalize_answer(a or "") for q, a in zip(questions, answers)])
  hops = np.array([q.hops for q in questions])
  return {"method": name, "em_1hop": float(em[hops == 1].mean()), "em_2hop": float(em[hops == 2].mean()),
          "em_all": float(em.mean()), "searches_per_question": float(searches),
          "contains_all": float(contains.mean())}


def plot_curve(history, path):
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  fig, ax = plt.subplots(figsize=(6, 3.5))
  train = [h for h in history if "reward_search_r1_em" in h]
  ax.plot([h["step"] for h in train], [h["reward_search_r1_em"] for h in train],
          label="train EM (on-policy rollouts)")
  ev = [h for h in history if "eval_em" in h]
  ax.plot([h["step"] for h in ev], [h["eval_em"] for h in ev], "o-", label="held-out EM (greedy)")
  ax.set_xlabel("RL step")
  ax.set_ylabel("exact match")
  ax.set_ylim(0, 1)
  ax.legend()
  ax.grid(alpha=0.3)
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--out", default=str(ROOT / "experiments/search_r1/out"))
  p.add_argument("--smoke", action="store_true", help="CPU smoke run: tiny KB, one step")
  p.add_argument("--steps", type=int, default=None, help="RL steps (default: the config's)")
  p.add_argument("--model", default=None, help="model source (default: the config's)")
  p.add_argument("--set", nargs="*", default=[], help="config overrides a.b=value")
  args = p.parse_args(argv)
  t0 = time.time()
  over = [*([f"num_steps={args.steps}"] if args.steps is not None else []),
          *([f"model.source={args.model}"] if args.model else []), "eval_at_start=True", *args.set]
  config = load_config(f"configs/search_r1.py:{'smoke' if args.smoke else ''}", over)
  out = pathlib.Path(args.out)
  out.mkdir(parents=True, exist_ok=True)
  print(f"[search_r1] device {jax.devices()[0].device_kind}; training {config.num_steps} steps", flush=True)
  result = job.run(config, str(out / "run"))
  tr, history = result["job"], result["history"]
  questions = tr.env.eval_items
  t_train = time.time() - t0
  print(f"[search_r1] trained in {t_train:.0f} s; baselines ...", flush=True)
  hits = tr.env.search_fn([q.question for q in questions])
  rows = [em_row("direct (no retrieval)", questions, answer_once(tr, questions, DIRECT), 0),
          em_row("RAG (top-3 of the question)", questions,
                 answer_once(tr, questions, RAG, [format_passages(h) for h in hits]), 1)]
  start = next(h for h in history if h["step"] == 0)
  final = [h for h in history if "eval_em" in h][-1]
  for name, h in (("Search-R1 loop, untrained", start), (f"Search-R1 trained ({final['step']} steps)", final)):
    rows.append({"method": name, "em_1hop": h["eval_em_1hop"], "em_2hop": h["eval_em_2hop"],
                 "em_all": h["eval_em"], "searches_per_question": h["eval_searches"]})
  wall = time.time() - t0
  device = jax.devices()[0].device_kind
  command = "python experiments/search_r1/run.py " + " ".join(sys.argv[1:] if argv is None else argv)
  plot_curve(history, out / "training_curve.png")
  samples = tr.env.results(tr.policy(tr.state["lora"]), questions[:2], None, greedy=True)
  (out / "results.json").write_text(json.dumps({"rows": rows, "history": history, "wall_s": wall,
                                                "device": device, "command": command,
                                                "sample_traces": [s.trace for s in samples]}, indent=1))
  table = ["| method | EM single-hop | EM two-hop | EM all | searches / question | reply contains answer |",
           "|---|---|---|---|---|---|"]
  table += [f"| {r['method']} | {r['em_1hop']:.3f} | {r['em_2hop']:.3f} | {r['em_all']:.3f} | "
            f"{r['searches_per_question']:.2f} | "
            f"{format(r['contains_all'], '.3f') if 'contains_all' in r else '-'} |" for r in rows]
  md = [f"# Search-R1 on a generated knowledge base{' (SMOKE RUN, not a result)' if args.smoke else ''}", "",
        f"Command: `{command}`  ", f"Device: {device}  ", f"Wall time: {wall:.0f} s (training {t_train:.0f} s)  ",
        f"Model: {config.model.source} ({config.model.dtype}, base {config.model.quant}, LoRA r={config.lora.r}); "
        f"objective {config.rl.objective} (n_off={config.rl.luffy.n_off if 'luffy' in config.rl else 0}), "
        f"{config.num_steps} steps x "
        f"{config.rl.prompts_per_step} questions x {config.rl.group_size} rows; "
        f"{len(questions)} held-out questions ({sum(q.hops == 2 for q in questions)} two-hop); "
        f"engine {config.search.engine}, top-{config.search.topk}.", "", *table, "",
        "![training curve](training_curve.png)", "", "Sample trace (trained, greedy):", "", "```",
        samples[0].trace, "```"]
  tmp = out / "RESULTS.md.tmp"
  tmp.write_text("\n".join(md) + "\n")
  os.replace(tmp, out / "RESULTS.md")
  print("\n".join(table), flush=True)
  print(f"[search_r1] wrote {out} in {wall:.0f} s", flush=True)


if __name__ == "__main__":
  main()
