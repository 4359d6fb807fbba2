"""A/B evaluation of two variants: task metrics, a pairwise LLM judge in both orders, bootstrap CIs, a report.

  python -m fineflax.evals --a http://127.0.0.1:8000/v1#base --b smollm2-135m-instruct+runs/sft/adapter \
      --data eval.jsonl [--rewards math_last_number] [--judge-url URL --judge-model M] [--out DIR]

Modules: variants (endpoint or local model), harness (eval set, run), judge (order swap), report (Markdown + PNG)
(intervals and pass@k: fineflax.stats); bench + benchmarks: avg@n / pass@n on the papers' evaluation files
(python -m fineflax.evals.bench).
"""
