"""RL on a 2x2 ("data", "fsdp") mesh of forced CPU devices equals one device, for every objective; a
checkpoint written on 4 devices restores onto 2 and the run goes on from the same state.

One subprocess runs both scripts: XLA_FLAGS must force 4 CPU devices before jax is imported.

Stability (issue 52 item 9): the update is compared once, within bounds derived in
fineflax/testing/tolerance.py; 24 of 24 back-to-back runs passed on a 2-core machine under load
(test_train_full_mesh.py's docstring says how).
"""
import textwrap

import pytest

from fineflax.testing.devices import run_script


SETUP = textwrap.dedent("""
    import jax, jax.numpy as jnp, numpy as np, optax
    from fineflax.models import ModelConfig, init_params
    from fineflax import lora as L
    from fineflax.models.quantize import quantize_params
    from fineflax.jobs.resolve import load_config
    from fineflax.rl import rows as R
    from fineflax.rl.objectives import get_objective
    from fineflax.rl.step import make_rl_fns
    from fineflax.rl.update import rl_update, shard_update_batch, update_batch
    from fineflax.mesh import make_mesh, replicate, shard_params
    from fineflax.train.state import init_state
    from fineflax.testing.tolerance import check_first_adamw_step, decoder_path_length, logprob_tol, sum_order_tol
    assert jax.device_count() == 4, jax.devices()
    c = ModelConfig(vocab_size=1024, hidden_size=64, intermediate_size=128, num_layers=1, num_heads=4,
                    num_kv_heads=2, head_dim=16, eos_token_ids=(1,))
    base = quantize_params(init_params(c, jax.random.PRNGKey(0)), kind="nf4")
    lcfg = L.LoraConfig(r=4, alpha=8.0)
    lora = jax.tree.map(lambda x: x + 0.02, L.init_lora(base, c, lcfg, jax.random.PRNGKey(1)))
    opt = optax.adamw(1e-2)

    def rows(n, g, seed):  # n groups of g rows; the last row of each group off-policy
      rng = np.random.RandomState(seed)
      out = R.empty_rows()
      for i in range(n * g):
        p, k = rng.randint(2, 1024, rng.randint(3, 9)), rng.randint(2, 12)
        comp = rng.randint(2, 1024, k)
        R.extend(out, R.make_rows([p], [comp], [[1.0] * k], [""], off_policy=i % g == g - 1,
                                  behaviour_logp=[-rng.rand(k) * 3]))
      return out, rng.randint(0, 2, n * g).astype(np.float32)
""")

PARITY = textwrap.dedent("""
    mesh = make_mesh(data=2, fsdp=2)
    base4 = shard_params(base, mesh)
    assert any(len(x.sharding.device_set) == 4 and not x.sharding.is_fully_replicated
               for x in jax.tree.leaves(base4)), "nothing of the base is split over fsdp"
    # grpo: 2 groups of 3 = 6 rows padded to 8, seq-mean loss, KL; luffy ("sum"), exgrpo: 8 rows
    for preset, n, g, over in (("", 2, 3, ["rl.beta=0.04", "rl.agg_mode=seq-mean-token-mean"]),
                               ("luffy", 2, 4, []), ("exgrpo", 2, 4, [])):
      rl = load_config("configs/grpo_arith.py:smoke" + ("," + preset if preset else ""),
                       over + [f"rl.group_size={g}"]).rl
      obj = get_objective(rl.objective)
      step, logp = make_rl_fns(opt, objective=rl.objective, loss_kwargs=obj.kwargs(rl),
                               fwd_kwargs=dict(model_config=c, lora_scale=2.0, temperature=0.7))
      rw, rewards = rows(n, g, seed=g)
      batch = update_batch(rw, rewards, np.ones(n, bool), group_size=g, pad_id=0, max_new_tokens=12,
                           advantage_scale=rl.advantage_scale, fields=obj.batch_fields)
      assert np.abs(batch["advantages"]).sum() > 0
      placed = shard_update_batch(batch, mesh)
      assert len(placed["advantages"].sharding.device_set) == 4
      np.testing.assert_array_equal(np.asarray(placed["advantages"])[:n * g], batch["advantages"])  # moved, not computed
      # One update (num_iterations=1): its tolerances follow from the arithmetic (fineflax/testing/
      # tolerance.py); a second AdamW step has none. The loss, its terms and every gradient entry are sums
      # over at most N = rows x width token terms, each through one token's forward/backward path of
      # L = decoder_path_length reductions: sum_order_tol(N + L, scale). A term is an advantage times a
      # ratio <= 1 (on-policy: exactly 1 at the first update; luffy's and exgrpo's shaped off-policy weights
      # w / (w + gamma) < 1) times the rollout importance weight where one is on (at most rl.importance_cap),
      # plus beta * KL, so Σ|terms| / N <= cap * max|advantage| + |metric| is the scale;
      # grad_norm adds its P squares. Each LoRA weight: AdamW's first-step bound (check_first_adamw_step).
      kw = dict(step_fn=step, logp_fn=logp, beta=rl.beta, num_iterations=1)
      s1, m1 = rl_update(init_state(lora, opt, 0), base, batch, **kw)
      s4, m4 = rl_update(replicate(init_state(lora, opt, 0), mesh), base4, batch, mesh=mesh, **kw)
      assert len(s4["params"]["q"]["a"].sharding.device_set) == 4
      N, L = batch["tokens"].size, decoder_path_length(c, batch["tokens"].shape[-1])
      P = sum(x.size for x in jax.tree.leaves(lora))
      cap = rl.importance_cap if obj.kwargs(rl)["importance"] != "none" else 1.0
      adv = cap * float(np.abs(batch["advantages"]).max())
      for k in ("loss", "pg_loss"):
        assert abs(m4[k] - m1[k]) <= float(sum_order_tol(N + L, adv + abs(m1[k]))), (rl.objective, k, m4[k], m1[k])
      assert abs(m4["grad_norm"] - m1["grad_norm"]) <= float(sum_order_tol(N + L + P, m1["grad_norm"])), \
          (rl.objective, m4["grad_norm"], m1["grad_norm"])
      margin = check_first_adamw_step(lora, s1["params"], s4["params"], s1["opt_state"][0].mu, N + L, 1e-2,
                                      1e-8, what=rl.objective)
      print(f"{rl.objective} tolerance margin {margin:.3f}", flush=True)
      assert not np.allclose(np.asarray(s1["params"]["q"]["b"]), np.asarray(lora["q"]["b"]))
      print(rl.objective, m1["loss"], m4["loss"], flush=True)
    from fineflax.sampling import generate
    prompts = [[5, 6, 7], [8, 9], [10, 11, 12, 13], [14]]
    a = generate(base, c, prompts, max_new_tokens=6, temperature=0.0, lora=lora, lora_scale=2.0,
                 dtype=jnp.float32, eos_ids=())
    b = generate(base4, c, prompts, max_new_tokens=6, temperature=0.0, lora=replicate(lora, mesh),
                 lora_scale=2.0, dtype=jnp.float32, eos_ids=(), mesh=mesh)
    np.testing.assert_array_equal(a.tokens, b.tokens)
    # log-probs: the reductions along one token's path over 4 + 6 positions (tolerance.logprob_tol)
    assert np.abs(a.logprobs - b.logprobs).max() <= logprob_tol(c, 10, a.logprobs)
    from fineflax.sampling.session import SamplerSession
    sess = SamplerSession(base4, c, max_total_len=6, temperature=0.0, lora=replicate(lora, mesh),
                          lora_scale=2.0, dtype=jnp.float32, eos_ids=(), mesh=mesh)
    sess.start(prompts)
    assert sess.cache["k"].sharding.spec[1] == ("data", "fsdp"), sess.cache["k"].sharding  # rows split
    sess.decode(3)
    assert sess.cache["k"].sharding.spec[1] == ("data", "fsdp"), sess.cache["k"].sharding
    rep = SamplerSession(base4, c, max_total_len=6, temperature=0.0, lora=replicate(lora, mesh), lora_scale=2.0,
                         dtype=jnp.float32, eos_ids=(), mesh=mesh, cache="replicas")
    rep.start(prompts)  # one engine per device, each with its own pool and one row here
    pools = rep.cache
    assert len(pools) == 4 and len({jax.tree.leaves(p)[0].devices().pop() for p in pools}) == 4, pools
    # sampled: row r draws with fold_in(rng, r) wherever it runs, so the split run equals one device
    kw = dict(max_new_tokens=8, temperature=1.0, top_p=0.9, lora_scale=2.0, dtype=jnp.float32, eos_ids=(),
              rng=jax.random.PRNGKey(3))
    many = [[5, 6, 7]] * 3 + [[8, 9], [10, 11, 12, 13], [14]] * 2  # a group of 3 stays on one device
    a = generate(base, c, many, lora=lora, **kw)
    b = generate(base4, c, many, lora=replicate(lora, mesh), mesh=mesh, cache="replicas", **kw)
    np.testing.assert_array_equal(a.tokens, b.tokens)
    assert np.abs(a.raw_logprobs - b.raw_logprobs).max() <= logprob_tol(c, 4 + 8, a.raw_logprobs)  # as above
    b2 = generate(base4, c, many, lora=replicate(lora, mesh), mesh=mesh, cache="replicas", max_rows=4, **kw)
    np.testing.assert_array_equal(a.tokens, b2.tokens)
    outs = []  # a multi-turn session (tool text appended between decodes, as Search-R1 does), split or not
    for params, lo, m, cache in ((base, lora, None, "paged"), (base4, replicate(lora, mesh), mesh, "static"),
                                 (base4, replicate(lora, mesh), mesh, "replicas")):
      s = SamplerSession(params, c, max_total_len=24, temperature=0.0, lora=lo, lora_scale=2.0,
                         dtype=jnp.float32, eos_ids=(), mesh=m, cache=cache)
      s.start(prompts[:3])
      s.decode(3)
      s.append({0: [20, 21], 2: [22]})
      s.decode(4)
      outs.append(s.result())
    for o in outs[1:]:
      np.testing.assert_array_equal(outs[0].tokens, o.tokens)
      np.testing.assert_array_equal(outs[0].valid, o.valid)
    print("PARITY OK", flush=True)
""")

RESHARD = textwrap.dedent("""
    import sys
    from fineflax.train.checkpoint import Checkpointer
    rl = load_config("configs/grpo_arith.py:smoke", ["rl.beta=0.04"]).rl
    assert get_objective(rl.objective).kwargs(rl)["importance"] == "none"  # the tolerance below takes ratios <= 1
    obj = get_objective(rl.objective)
    step, logp = make_rl_fns(opt, objective=rl.objective, loss_kwargs=obj.kwargs(rl),
                             fwd_kwargs=dict(model_config=c, lora_scale=2.0))
    rw, rewards = rows(4, 4, seed=0)
    batch = update_batch(rw, rewards, np.ones(4, bool), group_size=4, pad_id=0, max_new_tokens=12,
                         advantage_scale="group", fields=obj.batch_fields)
    kw = dict(step_fn=step, logp_fn=logp, beta=rl.beta, num_iterations=1)
    m4 = make_mesh(data=2, fsdp=2)
    m2 = make_mesh(data=2, fsdp=1, devices=jax.devices()[:2])
    state, _ = rl_update(replicate(init_state(lora, opt, 0), m4), shard_params(base, m4), batch, mesh=m4, **kw)
    ck = Checkpointer(sys.argv[1])
    assert ck.save(1, state, {"job": {}})
    ck.close()
    like = replicate(init_state(jax.tree.map(jnp.zeros_like, lora), opt, 5), m2)
    restored, _ = Checkpointer(sys.argv[1]).restore(like)
    for x in jax.tree.leaves(restored):
      assert x.sharding.device_set == set(jax.devices()[:2]), x.sharding
    jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)), state, restored)
    _, on4 = rl_update(state, shard_params(base, m4), batch, mesh=m4, **kw)
    _, on2 = rl_update(restored, shard_params(base, m2), batch, mesh=m2, **kw)
    # the same state, one update on 4 and on 2 devices: the loss within the PARITY check's bound
    N, L = batch["tokens"].size, decoder_path_length(c, batch["tokens"].shape[-1])
    scale = float(np.abs(batch["advantages"]).max()) + abs(on4["loss"])  # grpo: no importance weight
    assert abs(on2["loss"] - on4["loss"]) <= float(sum_order_tol(N + L, scale)), (on2["loss"], on4["loss"])
    assert int(restored["step"]) == 1
    print("RESHARD OK")
""")


def _run(script, *args):
  r = run_script(script, *args, devices=4, timeout=1200)
  assert r.returncode == 0 and "OK" in r.stdout, r.stdout[-2000:] + r.stderr[-3000:]
  return r.stdout


@pytest.mark.long
def test_mesh_rl_update_equals_one_device_for_every_objective_and_a_checkpoint_resumes_on_2(tmp_path):
  """advantages, loss, grad norm and the LoRA after one update agree within bounds derived from the
  arithmetic (fineflax/testing/tolerance.py) for grpo, luffy and exgrpo; a batch of 6 rows padded to 8 keeps the seq-mean loss; greedy rollouts with the base split
  over fsdp and the rows + KV cache split over all devices give the same tokens and log-probs. Then (same
  process: one start-up and setup for both) a checkpoint written on 4 devices restores onto 2 and the
  run goes on from the same state."""
  out = _run(SETUP + PARITY + RESHARD, str(tmp_path / "ckpt"))
  assert "PARITY OK" in out and "RESHARD OK" in out
