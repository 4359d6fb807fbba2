"""Several variants in one evaluation (fineflax.evals.harness.run_many, `--variant` x N): per-variant scores,
the judge against the baseline in both orders, one-line errors; RAG variants of a config by name."""
import json

import pytest

from fineflax.evals.__main__ import main
from fineflax.evals.harness import parse_row, run_many
from fineflax.evals.rag_variants import GenerateLLM, rag_variants  # noqa: F401 (the in-process RAG variants)

pytestmark = pytest.mark.fast

ROWS = [parse_row({"question": q, "answer": a}, f"row {i}")
        for i, (q, a) in enumerate([("Where was Ada born?", "Kaford"), ("Olm river country?", "Vorland"),
                                    ("Item QX-1?", "drill"), ("Rule?", "sign a waiver")])]


def test_per_variant_scores_and_judge_against_the_baseline():
  right = lambda prompts: [r["reference"] for r in ROWS]
  half = lambda prompts: [r["reference"] if i % 2 else "no idea" for i, r in enumerate(ROWS)]
  wrong = lambda prompts: ["no idea"] * len(prompts)
  calls = []

  def judge(messages):  # prefers the response holding the reference, in whichever position
    text = messages[1]["content"]
    calls.append(text)
    ref = text.split("[Reference answer]\n")[1].split("\n")[0]
    r1 = text.split("[Response 1]\n")[1].split("\n[End of Response 1]")[0]
    r2 = text.split("[Response 2]\n")[1].split("\n[End of Response 2]")[0]
    return "[[tie]]" if (ref in r1) == (ref in r2) else ("[[1]]" if ref in r1 else "[[2]]")
  out = run_many(ROWS, {"half": half, "right": right, "wrong": wrong}, judge=judge, num_resamples=200)
  s = out["summary"]
  assert s["baseline"] == "half"
  assert {n: v["metrics"]["exact_match_lenient"]["value"] for n, v in s["variants"].items()} == {
      "half": 0.5, "right": 1.0, "wrong": 0.0}
  assert s["variants"]["right"]["judge_vs_baseline"]["win"]["value"] == 0.5  # wins where half said "no idea"
  assert s["variants"]["wrong"]["judge_vs_baseline"]["loss"]["value"] == 0.5
  assert "judge_vs_baseline" not in s["variants"]["half"] and len(calls) == 2 * 2 * len(ROWS)


def test_cli_errors_are_one_line(tmp_path, capsys):
  data = tmp_path / "q.jsonl"
  data.write_text("".join(json.dumps({"question": r["prompt"][0]["content"], "answer": r["reference"]}) + "\n"
                          for r in ROWS))
  rag = tmp_path / "rag.json"
  corpus = tmp_path / "kb.jsonl"
  corpus.write_text(json.dumps({"id": "d", "text": "Ada was born in Kaford."}) + "\n")
  rag.write_text(json.dumps({"retrievers": {"bm25": {"kind": "bm25", "corpus": str(corpus)}},
                             "variants": {"naive_rag": {"retriever": "bm25"}}}))
  for argv, message in [(["--variant", "http://h/v1#a"], "two or more distinct variants"),
                        (["--variant", "naive_rag", "--variant", "smart_rag", "--rag-config", str(rag)],
                         "--variant smart_rag: not a variant of --rag-config"),
                        (["--variant", "naive_rag", "--variant", "http://h/v1#a", "--rag-config", str(rag)],
                         "need a generator: --generator"),
                        ([], "give --a and --b, or two or more --variant")]:
    assert main([*argv, "--data", str(data), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err, err
