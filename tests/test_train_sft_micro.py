"""SFT with train.micro_batch_tokens: the step's sequences re-packed into token-budget rows
(`fineflax.data.packing.repack`) give the same update as the padded grad_accum step (`sft_step`)."""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fineflax.data.packing import assemble, repack, shift
from fineflax.models import init_params
from fineflax.train.sft_step import make_sft_fns, make_sft_micro_step, stack_micro_batches
from test_train_rl_step import CFG, _lora


def _batches(seed=0):
  """Two batches of 3 rows x 20 tokens, 1-2 sequences a row (as `fineflax.data` packs them)."""
  rng = np.random.RandomState(seed)
  out = []
  for _ in range(2):
    rows = []
    for _ in range(3):
      row = []
      for _ in range(rng.randint(1, 3)):
        ids = rng.randint(2, 97, rng.randint(4, 10))
        row.append(shift(ids, (rng.rand(len(ids)) > 0.3).astype(np.int32)))
      rows.append(row)
    out.append(assemble(rows, 20, pad_id=0))
  return out


@pytest.mark.fast
def test_repack_keeps_every_sequence_whole():
  batches = _batches()
  mbs = repack(batches, 24, rows_multiple=2, pad_id=0)
  assert all(mb["tokens"].shape == (2, 24) for mb in mbs)
  for key in ("attention_mask", "loss_mask"):
    assert sum(mb[key].sum() for mb in mbs) == sum(b[key].sum() for b in batches)
  got = sorted(tuple(mb["tokens"][r][mb["segment_ids"][r] == s]) for mb in mbs for r in range(2)
               for s in range(1, mb["segment_ids"][r].max() + 1))
  want = sorted(tuple(b["tokens"][r][b["segment_ids"][r] == s]) for b in batches for r in range(3)
                for s in range(1, b["segment_ids"][r].max() + 1))
  assert got == want
  with pytest.raises(ValueError, match=r"config.train.micro_batch_tokens=6: a sequence holds \d+ tokens"):
    repack(batches, 6, 1, 0)


def test_micro_batched_sft_step_equals_the_grad_accum_step():
  base = init_params(CFG, jax.random.PRNGKey(0))
  lora = _lora(base, b_scale=0.02)
  opt = optax.sgd(0.5)
  state = {"step": jnp.zeros((), jnp.int32), "params": lora, "opt_state": opt.init(lora), "rng": jax.random.PRNGKey(0)}
  kw = dict(model_config=CFG, lora_scale=2.0)
  batches = _batches()
  whole, _ = make_sft_fns(opt, **kw)
  s1, m1 = whole(state, base, stack_micro_batches(batches, 0))
  mbs = repack(batches, 16, rows_multiple=1, pad_id=0)
  assert len(mbs) >= 3
  s2, m2 = make_sft_micro_step(opt, **kw)(state, base, mbs)
  np.testing.assert_allclose(float(m2["loss"]), float(m1["loss"]), rtol=1e-5)
  np.testing.assert_allclose(float(m2["grad_norm"]), float(m1["grad_norm"]), rtol=1e-5)
  assert m2["loss_tokens"] == float(m1["loss_tokens"]) and m2["tokens"] == float(m1["tokens"])
  for a, b in zip(jax.tree.leaves(s2["params"]), jax.tree.leaves(s1["params"])):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-6)
  assert int(s2["step"]) == 1
