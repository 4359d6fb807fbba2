"""The adaptation-loop experiment (experiments/adaptation_loop): its pure pieces, the SFT job's
`config.lora.init_from`, and the whole loop in --smoke mode on a tiny random model."""
import json
import pathlib

import numpy as np
import pytest

from experiments.adaptation_loop import loop


def test_questions_are_distinct_and_splits_disjoint():
  qs = loop.make_questions(300, seed=3)
  texts = [q["question"] for q in qs]
  assert len(set(texts)) == 300
  for q in qs:
    a, op, b = q["question"][len("What is "):-1].split()
    assert 61 <= int(a) <= 99 and 2 <= int(b) <= 40
    assert int(q["answer"]) == (int(a) + int(b) if op == "+" else int(a) - int(b)) >= 0
  assert loop.make_questions(300, seed=3) == qs and loop.make_questions(300, seed=4) != qs
  rows = loop.eval_rows(qs[:2])
  assert rows[0]["golden_answers"] == [qs[0]["equation"], qs[0]["answer"]]
  with pytest.raises(ValueError, match="only 3042 distinct"):
    loop.make_questions(4000, seed=0)


def test_noisy_chats_shift_every_result_and_keep_the_format():
  clean = [json.loads(line) for line in loop.BUNDLED_TRAIN.read_text().splitlines()]
  noisy = loop.noisy_chats(seed=0)
  assert len(noisy) == len(clean)
  shifts = []
  for c, n in zip(clean, noisy):
    for mc, mn in zip(c["messages"], n["messages"]):
      if mc["role"] != "assistant":
        assert mc == mn
        continue
      lc, rc = mc["content"].rstrip(".").rsplit(" = ", 1)
      ln, rn = mn["content"].rstrip(".").rsplit(" = ", 1)
      assert lc == ln and mn["content"].endswith(".")
      shifts.append(int(rn) - int(rc))
  assert all(1 <= abs(d) <= 9 for d in shifts) and len(set(shifts)) == 18


def test_routing_metrics_by_hand():
  recs = [{"variant": v, "reward": r} for v, r in
          [("a", 1), ("b", 0), ("a", 0), ("b", 0), ("a", 1), ("a", 1)]]
  m = loop.routing_metrics(recs, ["a", "b"], last=4)
  assert m["best"] == "a" and m["variants"]["a"] == {"requests": 4, "mean_reward": 0.75}
  assert m["share_last"] == 0.75 and m["share_all"] == pytest.approx(4 / 6)
  # gap 0.75 per request routed to b (requests 2 and 4)
  np.testing.assert_allclose(m["cumulative_regret"], [0, 0.75, 0.75, 1.5, 1.5, 1.5])
  assert m["uniform_regret_per_request"] == pytest.approx(0.375)
  assert m["rolling_window"] == 2 and m["rolling_share"] == [1.0, 0.5, 0.5, 0.5, 0.5, 1.0]


def _tiny_adapter(tmp_path, r=4, alpha=8.0):
  from fineflax import lora as L
  from fineflax.models import ModelConfig
  config = ModelConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_layers=2, num_heads=4,
                       num_kv_heads=2, head_dim=8)
  rng, lora = np.random.default_rng(0), {}
  cfg = L.LoraConfig(r=r, alpha=alpha)
  for t in L.resolve_targets(cfg.target_modules):
    n_in, n_out = config.linear_shapes()[t]
    lora[t] = {"a": rng.standard_normal((2, n_in, r)).astype(np.float32),
               "b": rng.standard_normal((2, r, n_out)).astype(np.float32)}
  return config, lora, L.export_peft(lora, cfg, config, tmp_path / "ad")


def test_sft_init_from_loads_the_adapter_and_rejects_a_mismatch(tmp_path):
  from fineflax import lora as L
  from fineflax.train.model_setup import start_adapter
  config, lora, path = _tiny_adapter(tmp_path)
  got = start_adapter(str(path), config, L.LoraConfig(r=4, alpha=8.0))
  assert sorted(got) == sorted(lora)
  for t in lora:
    np.testing.assert_allclose(np.asarray(got[t]["a"]), lora[t]["a"], rtol=1e-6)
    np.testing.assert_allclose(np.asarray(got[t]["b"]), lora[t]["b"], rtol=1e-6)
  with pytest.raises(ValueError, match=r"init_from=.*'r': \(4, 16\)"):
    start_adapter(str(path), config, L.LoraConfig(r=16, alpha=8.0))
  with pytest.raises(ValueError, match=r"'targets': \(\[.*\], \['q', 'v'\]\)"):
    start_adapter(str(path), config, L.LoraConfig(r=4, alpha=8.0, target_modules=("q", "v")))


@pytest.mark.long
def test_smoke_loop_end_to_end(tiny_smol, tmp_path):
  """run.py --smoke, smaller still: two adapters served, 8 routed requests with feedback, SFT data, SFT
  (one step per run), evals A/B on 4 held-out questions."""
  from experiments.adaptation_loop import run
  out = tmp_path / "out"
  res = run.main(["--smoke", "--model", tiny_smol, "--min-reward", "0", "--out", str(out), "--variant-steps", "1",
                  "--feedback-steps", "1", "--requests", "8", "--last", "4", "--eval-questions", "4",
                  "--sft-set", "lora.targets=('q','v')"])  # 4 adapter tensors per layer, not 14: faster compiles
  for name in ("results.json", "RESULTS.md", "adaptation_loop.png", "eval_noisy_before_vs_after/report.md"):
    assert (out / name).stat().st_size > 0, name
  saved = json.loads((out / "results.json").read_text())
  assert saved["routing"]["share_last"] == res["routing"]["share_last"]
  r = res["routing"]
  assert sum(v["requests"] for v in r["variants"].values()) == 8 == len(r["cumulative_regret"])
  assert 0.0 <= r["share_last"] <= 1.0 and r["last"] == 4 and r["best"] in ("tuned", "noisy")
  # the server's own statistics (/rl/stats) agree with what the users saw
  for v in ("tuned", "noisy"):
    served = res["server_stats"]["variants"][v]
    assert served["responses"] == served["feedback"] == r["variants"][v]["requests"]
    assert served["mean_reward"] == pytest.approx(r["variants"][v]["mean_reward"])
  fb = res["feedback_data"]
  assert fb["rated"] == 8 and fb["sft_rows"] == fb["train"] > 0
  rows = [json.loads(x) for x in (out / "work" / "feedback_sft.jsonl").read_text().splitlines()]
  assert len(rows) == fb["sft_rows"] and all(m["messages"][-1]["role"] == "assistant" for m in rows)
  assert res["heldout_disjoint_from_users"] is True
  assert res["ab"]["n"] == 4 and {"exact_match_lenient", "math_last_number"} <= set(res["ab"]["metrics"])
  assert res["ab_reference"] is None  # --reference-eval not asked
  assert "noisy after" in (out / "RESULTS.md").read_text()
  cmds = "\n".join(res["commands"])
  for part in ("-m fineflax.serve", "-m fineflax.data.from_feedback", "-m fineflax.evals",
               "--config.lora.init_from=", "--router thompson"):
    assert part in cmds, part
  assert (pathlib.Path(out) / "work" / "sft_feedback" / "adapter" / "adapter_config.json").exists()
