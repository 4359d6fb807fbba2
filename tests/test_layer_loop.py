"""`model.layer_loop = "unrolled"` (a Python loop over per-layer slices) computes what the layer scan does:
logits, and one SFT step's loss and LoRA gradients, on f32 and NF4 weights; same remat policy per layer; and its
compiled training step holds no dynamic-update-slice of per-layer residual stacks (the mechanism)."""
import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from benchmarks.layer_loop_hlo import count_ops
from fineflax import lora as L
from fineflax.models import ModelConfig, forward, init_params, quantize_params
from fineflax.models.decoder import REMAT_POLICIES, forward_cached, init_cache
from fineflax.models.layer_loop import LAYER_LOOPS
from fineflax.train.sft_step import make_sft_fns
from fineflax.train.state import init_state

C = ModelConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4,
                num_kv_heads=2, head_dim=8)
UNROLLED = dataclasses.replace(C, layer_loop="unrolled")
# LoRA gradients, norm-relative per leaf: f32 round-off only. On this model each path is 2-3e-5 from an
# evaluation with f64 weights and activations, and they differ from each other by ~1e-5 (XLA fuses L
# copies of the body differently from one scanned body); a wrong layer order or key is off by > 1e-3
GRAD_RTOL = 4e-5


@functools.lru_cache(maxsize=None)
def _setup(kind):
  def build(key):
    params = init_params(C, key)
    if kind == "nf4":
      params = quantize_params(params, kind="nf4")
    lora = L.init_lora(params, C, L.LoraConfig(r=4, alpha=8.0), jax.random.PRNGKey(1))
    return params, jax.tree.map(lambda x: x + 0.05, lora)  # b = 0 at init: make the adapters matter
  return jax.jit(build)(jax.random.PRNGKey(0))


def _batch(a=1, b=2, t=16):
  rng = np.random.RandomState(0)
  seg = np.where(np.arange(t) < t // 2, 1, 2)  # two packed segments a row
  pos = np.where(seg == 1, np.arange(t), np.arange(t) - t // 2)
  return {"tokens": rng.randint(0, C.vocab_size, (a, b, t)).astype(np.int32),
          "targets": rng.randint(0, C.vocab_size, (a, b, t)).astype(np.int32),
          "loss_mask": (rng.rand(a, b, t) > 0.2).astype(np.float32),
          "attention_mask": np.ones((a, b, t), np.int32),
          "positions": np.broadcast_to(pos, (a, b, t)).astype(np.int32).copy(),
          "segment_ids": np.broadcast_to(seg, (a, b, t)).astype(np.int32).copy()}


def _rel(x, y) -> float:
  x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
  return float(np.linalg.norm(x - y) / np.linalg.norm(x))


@functools.lru_cache(maxsize=None)
def _logits_fn(config):
  """jit of the logits for (params, lora, micro-batch [1, B, T]) with packed segments: one compile per config."""
  return jax.jit(lambda params, lora, mb: forward(params, config, mb["tokens"][0], positions=mb["positions"][0],
                                                  segment_ids=mb["segment_ids"][0], lora=lora, lora_scale=2.0))


@pytest.mark.parametrize("kind", ["f32", "nf4"])
def test_unrolled_logits_equal_the_scan(kind):
  params, lora = _setup(kind)
  mb = _batch()
  logits_s = _logits_fn(C)(params, lora, mb)
  logits_u = _logits_fn(UNROLLED)(params, lora, mb)
  assert _rel(logits_s, logits_u) < 1e-6
  # the comparison can fail: the layers in reverse order (scanned) are far from the unrolled loop
  rev = lambda tree: jax.tree.map(lambda a: a[::-1], tree)
  logits_r = _logits_fn(C)(dict(params, layers=rev(params["layers"])), rev(lora), mb)
  assert _rel(logits_r, logits_u) > 1e-3


@pytest.mark.parametrize("remat", ["none", "full", "dots"])
def test_unrolled_loop_checkpoints_every_layer_with_the_remat_policy(remat):
  params, lora = _setup("f32")
  tok = jnp.zeros((1, 8), jnp.int32)
  for config in (C, UNROLLED):
    jaxpr = jax.make_jaxpr(lambda lo: forward(params, config, tok, lora=lo, remat=remat))(lora)
    eqns = [e for e in jaxpr.jaxpr.eqns if e.primitive.name == "scan"]
    eqns = eqns[0].params["jaxpr"].jaxpr.eqns if eqns else jaxpr.jaxpr.eqns
    policies = [e.params["policy"] for e in eqns if "remat" in e.primitive.name or e.primitive.name == "checkpoint"]
    expected = 0 if remat == "none" else (C.num_layers if config is UNROLLED else 1)
    assert len(policies) == expected and all(p is REMAT_POLICIES[remat] for p in policies), (config, policies)


OPT = optax.sgd(1.0)  # the update is the gradient: the step test compares gradients (Adam's first step ~ sign)


@functools.lru_cache(maxsize=None)
def _compiled_step(kind, dropout, loop):
  """(compiled SFT step, its HLO text, params, lora, batch) for remat=full, logits_chunk=8, 2 micro-batches."""
  params, lora = _setup(kind)
  batch = _batch(a=2)
  train, _ = make_sft_fns(OPT, model_config=dataclasses.replace(C, layer_loop=loop), lora_scale=2.0,
                          lora_dropout=dropout, remat="full", logits_chunk=8)
  compiled = train.lower(init_state(lora, OPT, seed=3), params, batch).compile()
  return compiled, compiled.as_text(), params, lora, batch


@pytest.mark.parametrize("kind,dropout", [("f32", 0.0), ("nf4", 0.1)])
def test_one_sft_step_unrolled_equals_scan_without_residual_stack_updates(kind, dropout):
  """Same loss, gradient norm and updated LoRA params; with SGD(lr=1) the update is minus the LoRA gradient
  (of the packed, chunked-loss, remat=full, 2-micro-batch step; NF4: with LoRA dropout). The same two
  compiled steps (one test, so that xdist workers do not compile them twice): the unrolled one holds no
  dynamic-update-slice of per-layer residual stacks, the scanned one does (the mechanism)."""
  out, counts = {}, {}
  for loop in ("scan", "unrolled"):
    compiled, hlo, params, lora, batch = _compiled_step(kind, dropout, loop)
    out[loop] = compiled(init_state(lora, OPT, seed=3), params, batch)
    counts[loop] = count_ops(hlo)["dus_layers"]  # dynamic-update-slices outside the loss head
  (s_s, m_s), (s_u, m_u) = out["scan"], out["unrolled"]
  assert abs(float(m_s["loss"]) - float(m_u["loss"])) <= 1e-6 * abs(float(m_s["loss"]))
  assert abs(float(m_s["grad_norm"]) - float(m_u["grad_norm"])) <= GRAD_RTOL * float(m_s["grad_norm"])
  errs = jax.tree.map(lambda a, b, a0: _rel(np.asarray(a) - np.asarray(a0), np.asarray(b) - np.asarray(a0)),
                      s_s["params"], s_u["params"], lora)
  assert max(jax.tree.leaves(errs)) < GRAD_RTOL, errs
  assert counts["unrolled"] == 0 and counts["scan"] > 0, counts


def test_unknown_layer_loop_is_a_clear_error():
  params, _ = _setup("f32")
  with pytest.raises(ValueError, match=r"layer_loop='while'; choose one of \('scan', 'unrolled'\)"):
    forward(params, dataclasses.replace(C, layer_loop="while"), jnp.zeros((1, 4), jnp.int32))


def test_unrolled_per_layer_inputs_and_kv_cache_match_the_scan():
  """Gemma-3-like layers (sliding / full alternation with per-layer rope, q/k norms, sandwich norms):
  per-layer windows and rope go to the right layer; prefill + one decode step with a KV cache agree."""
  c = dataclasses.replace(C, model_type="gemma3_text", qk_norm=True, sandwich_norms=True,
                          norm_offset=1.0, embed_scale=True, sliding_window=3, local_rope_theta=10.0,
                          layer_types=("sliding_attention", "full_attention"))
  params = init_params(c, jax.random.PRNGKey(0))
  tok = jax.random.randint(jax.random.PRNGKey(2), (2, 8), 0, c.vocab_size)
  @functools.partial(jax.jit, static_argnums=0)
  def run(config):
    cache = init_cache(config, 2, 12, jnp.float32)
    prefill, cache = forward_cached(params, config, tok, cache)
    step, cache = forward_cached(params, config, tok[:, :1], cache)
    return forward(params, config, tok), prefill, step, cache["k"]
  out = {loop: run(dataclasses.replace(c, layer_loop=loop)) for loop in LAYER_LOOPS}
  for s, u in zip(out["scan"], out["unrolled"]):
    assert _rel(s, u) < 1e-6
  # the per-layer windows matter here: every layer full-attention gives other logits
  full = dataclasses.replace(c, layer_types=("full_attention",) * 2, layer_loop="unrolled")
  assert _rel(jax.jit(forward, static_argnums=1)(params, full, tok), out["unrolled"][0]) > 1e-4


def test_config_layer_loop_is_validated():
  from fineflax.config_checks import ConfigError
  from fineflax.jobs.resolve import load_config, validate
  with pytest.raises(ConfigError, match=r"config.model.layer_loop='while': choose one of 'auto', 'scan', 'unrolled'"):
    validate(load_config("configs/grpo_arith.py:smoke", ["model.layer_loop=while"]))
  validate(load_config("configs/grpo_arith.py:smoke", ["model.layer_loop=unrolled"]))
  assert load_config("configs/quickstart.py")["model"]["layer_loop"] == "auto"  # the configs' default


@pytest.mark.parametrize("loop,remat,backend,want", [
    ("auto", "none", "gpu", "unrolled"),  # measured faster and smaller (benchmarks/RESULTS.md, sft_unroll)
    ("auto", "full", "gpu", "scan"),  # unrolled: +40-55% peak memory under remat for 2-4% speed
    ("auto", "dots", "gpu", "scan"),
    ("auto", "none", "cpu", "scan"),  # CPU: only a longer compile
    ("unrolled", "full", "cpu", "unrolled"),  # an explicit choice is kept
    ("scan", "none", "gpu", "scan"),
])
def test_auto_layer_loop_resolves_by_backend_and_remat(loop, remat, backend, want):
  from fineflax.models.layer_loop import resolve_layer_loop
  assert resolve_layer_loop(loop, remat, backend) == want


def test_setup_model_resolves_auto_on_this_backend(tiny_smol):
  from fineflax.train.model_setup import setup_model
  from fineflax.jobs.resolve import load_config
  config = load_config("configs/quickstart.py", [f"model.source={tiny_smol}", "model.quant=none"])
  assert config.model.layer_loop == "auto"
  assert setup_model(config)[1].layer_loop == "scan"  # CPU
  with pytest.raises(ValueError, match=r"model.layer_loop='while'; choose one of \('auto', 'scan', 'unrolled'\)"):
    from fineflax.models.layer_loop import resolve_layer_loop
    resolve_layer_loop("while", "none")


def test_a_run_resumes_across_layer_loops():
  from fineflax.train.run_config import config_diff
  saved = {"model": {"remat": "none"}, "seed": 0}  # a config from before model.layer_loop existed
  assert config_diff(saved, {"model": {"remat": "none", "layer_loop": "unrolled"}, "seed": 0}) == []
  assert config_diff(saved, {"model": {"remat": "full", "layer_loop": "scan"}, "seed": 0}) == [
      ("model.remat", "none", "full")]
