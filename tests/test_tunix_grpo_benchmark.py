"""benchmarks/tunix_grpo.py (issue 31's tunix target): the Qwen2.5-1.5B shape is the published model, both
frameworks get the same full-parameter step, the tunix case can run under another interpreter, and the
report marks the 1.3x target; (slow) the fineflax full-parameter worker at a tiny Qwen2 shape."""
import argparse
import sys

import pytest

from benchmarks import rl, tunix_grpo

pytestmark = pytest.mark.fast


def _args(**kw):
  base = dict(smoke=False, prompts=None, group=None, prompt_len=None, new_tokens=None, warmup=1, steps=2,
              remat="full", micro=32, tunix_remat="NONE", frameworks=None, micro_batch_size=0, micro_batch_tokens=0,
              old_logp="auto", decode_impl="auto", variants=None)
  return argparse.Namespace(**dict(base, **kw))


def test_qwen2_shape_has_the_published_parameter_counts():
  import jax
  import jax.numpy as jnp

  from fineflax.models import ModelConfig, init_params
  s = tunix_grpo.qwen2_shape()
  mc = ModelConfig(vocab_size=s["vocab"], hidden_size=s["hidden"], intermediate_size=s["inter"],
                   num_layers=s["layers"], num_heads=s["heads"], num_kv_heads=s["kv_heads"], head_dim=s["head_dim"],
                   tie_word_embeddings=True, attention_bias=True)  # as the fineflax worker builds it
  params = jax.eval_shape(lambda: init_params(mc, jax.random.PRNGKey(0), dtype=jnp.bfloat16))
  total = sum(x.size for x in jax.tree.leaves(params))
  # the Qwen2.5-1.5B model card: 1.54B parameters, 1.31B of them outside the (tied) embedding
  assert round(total / 1e9, 2) == 1.54
  assert round((total - params["embed"].size) / 1e9, 2) == 1.31
  assert (s["head_dim"], s["norm_eps"], s["arch"]) == (128, 1e-6, "qwen2")
  with pytest.raises(ValueError, match="not a Qwen2"):
    tunix_grpo.qwen2_shape("meta-llama/Llama-3.2-3B")


def test_cases_give_both_frameworks_the_same_full_parameter_step():
  fineflax, tunix = tunix_grpo.cases(_args())
  assert (fineflax["framework"], tunix["framework"]) == ("fineflax", "tunix")
  same = ("shape", "params", "prompts", "group", "prompt_len", "new_tokens", "agg_mode", "warmup", "steps")
  assert {k: fineflax[k] for k in same} == {k: tunix[k] for k in same}
  assert fineflax["params"] == "full" and (fineflax["prompts"], fineflax["group"], fineflax["new_tokens"]) == (32, 8, 256)
  assert tunix["tunix_preset"] == "qwen2p5_1p5b"  # the tunix worker checks the shape against it
  smoke = tunix_grpo.cases(_args(smoke=True, frameworks=["tunix"]))
  assert [c["framework"] for c in smoke] == ["tunix"] and smoke[0]["tunix_preset"] is None


def test_variants_give_one_fineflax_case_each_then_tunix_once():
  cs = tunix_grpo.cases(_args(variants=["remat=full", "remat=none,micro=32,decode=scan,old_logp=recompute"],
                              decode_impl="unrolled"))
  assert [(c["framework"], c.get("variant")) for c in cs] == [
      ("fineflax", "remat=full"), ("fineflax", "remat=none,micro=32,decode=scan,old_logp=recompute"), ("tunix", None)]
  a, b, t = cs
  assert (a["remat"], a["micro_batch_size"], a["decode_impl"], a["old_logp"]) == ("full", 0, "unrolled", "auto")
  assert (b["remat"], b["micro_batch_size"], b["decode_impl"], b["old_logp"]) == ("none", 32, "scan", "recompute")
  assert t["remat"] == "full" and "variant" not in t  # tunix keeps its own settings
  for bad, msg in (("micro=x", "not an integer"), ("remat=some", "choose one of"), ("rows=3", "not KEY=VALUE")):
    with pytest.raises(argparse.ArgumentTypeError, match=msg):
      tunix_grpo.parse_variant(bad)
  with pytest.raises(SystemExit):  # argparse turns a bad spec into a usage error
    tunix_grpo.main(["--smoke", "--variants", "remat=some"])


def test_run_cases_starts_the_tunix_case_under_its_own_interpreter(monkeypatch, tmp_path):
  seen = []

  def fake_run_worker(argv, env=None, timeout=0):
    seen.append(argv)
    return {"error": "not run"}
  monkeypatch.setattr(rl.gpu, "run_worker", fake_run_worker)
  rows, _ = rl.run_cases(tunix_grpo.cases(_args(smoke=True)), command="c", out_dir=tmp_path, smoke=True,
                         budget=100, timeout=50, name="tunix_grpo", python={"tunix": "/venv/bin/python"})
  assert [a[0] for a in seen] == [sys.executable, "/venv/bin/python"]
  assert all(a[1:4] == ["-m", "benchmarks.rl", "--worker"] for a in seen)
  assert (tmp_path / "tunix_grpo.json").exists() and len(rows) == 2


def _row(framework, step, rollout):
  return {"model": "Qwen2.5-1.5B", "framework": framework, "prompts": 32, "group": 8, "new_tokens": 256,
          "prompt_len": 64, "warmup": 1, "steps": 2, "settings": "s", "versions": {}, "params": "full",
          "trainable_params": 1_543_714_304,
          "timed": {"step": step, "rollout": rollout, "generate": rollout, "update": step - rollout},
          "first": {"step": 9.0, "rollout": 4.0, "update": 5.0}, "setup_s": 1.0, "peak_bytes": None}


def test_report_marks_the_full_parameter_target():
  md = rl.report([_row("fineflax", 4.0, 1.0), _row("tunix", 5.0, 2.0)], "gpu", "c", smoke=False,
                 targets={"tunix": tunix_grpo.TARGET}, title="GRPO step at the Qwen2.5-1.5B shape: fineflax vs tunix")
  assert md.startswith("## GRPO step at the Qwen2.5-1.5B shape: fineflax vs tunix (full parameters,")
  assert "fineflax 4.00 s vs tunix 5.00 s per step = **1.25x** (target >= 1.3x: missed); rollout 2.00x, " \
         "update 1.00x" in md
  assert "of every parameter (bf16 parameters, f32 AdamW moments)" in md
  assert "trainable parameters: fineflax 1,543,714,304, tunix 1,543,714,304" in md


def test_report_compares_tunix_with_every_fineflax_variant():
  rows = [dict(_row("fineflax", 4.0, 1.0), variant="remat=full"), dict(_row("fineflax", 2.5, 1.0), variant="remat=none"),
          _row("tunix", 5.0, 2.0)]
  md = rl.report(rows, "gpu", "c", smoke=False, targets={"tunix": tunix_grpo.TARGET})
  assert "| Qwen2.5-1.5B | fineflax (remat=none) | 2.5 |" in md and "| 1.00x |" in md and "| 0.62x |" in md
  assert "| Qwen2.5-1.5B | tunix | 5 |" in md and "| **2.00x** |" in md  # against the fastest fineflax case
  best = md.index("fineflax (remat=none) 2.50 s vs tunix 5.00 s per step = **2.00x** (target >= 1.3x: met)")
  assert best < md.index("fineflax (remat=full) 4.00 s vs tunix 5.00 s per step = **1.25x** (target >= 1.3x: missed)")


@pytest.mark.slow
def test_fineflax_full_parameter_grpo_worker_trains_the_whole_tiny_qwen2():
  pytest.importorskip("tokenizers")
  from benchmarks import _rl_fineflax
  spec = dict(tunix_grpo.cases(_args(smoke=True, frameworks=["fineflax"]))[0], steps=1)
  res = _rl_fineflax.run(spec)
  s = tunix_grpo.TINY_QWEN2
  h, i, q, kv = s["hidden"], s["inter"], s["heads"] * s["head_dim"], s["kv_heads"] * s["head_dim"]
  per_layer = h * (q + 2 * kv) + (q + 2 * kv) + q * h + 3 * h * i + 2 * h  # q/k/v (+ biases), o, mlp, 2 norms
  assert res["trainable_params"] == s["vocab"] * h + s["layers"] * per_layer + h  # + tied embedding, final norm
  assert len(res["all"]) == 2 and res["timed"]["step"] > 0
  assert res["completion_len"] == spec["new_tokens"]  # EOS off: every row has exactly new_tokens tokens
