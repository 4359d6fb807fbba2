"""Batches: packing layout, packed logits == logits of each sequence alone (tiny random decoder), length
buckets, truncation policies, mixture frequencies and epochs, and exact resume of mixture and iterator."""
import json

import jax
import numpy as np
import pytest

from fineflax.data import Mixture, build_mixture, load_source, make_batch_iterator, sample_file, tokenize_chat
from fineflax.data.packing import shift
from fineflax.models import ModelConfig, forward, init_params

KEYS = {"tokens": np.int32, "targets": np.int32, "loss_mask": np.float32, "attention_mask": np.int32,
        "positions": np.int32, "segment_ids": np.int32}


@pytest.fixture(scope="module")
def tok():
  from fineflax.models import load_tokenizer
  return load_tokenizer("smollm2-135m-instruct")


@pytest.fixture(scope="module")
def sources():
  return {n: load_source(sample_file(n)) for n in ("arithmetic_messages.jsonl", "units_sharegpt.json",
                                                   "strings_prompt_completion.csv")}


def segments(batch, r):
  """[(start, end)] of each segment of row r."""
  seg = batch["segment_ids"][r]
  return [(int(np.argmax(seg == s)), int(np.argmax(seg == s)) + int((seg == s).sum()))
          for s in range(1, seg.max() + 1)]


def test_packing_layout_matches_each_example(tok, sources):
  mix = Mixture([(sources["arithmetic_messages.jsonl"], 1.0)], seed=3, shuffle=False)
  it = make_batch_iterator(mix, tok, batch_size=2, max_length=160, packing=True)
  batch = next(it)
  assert {k: v.dtype for k, v in batch.items()} == KEYS
  assert all(v.shape == (2, 160) for v in batch.values())
  reference = Mixture([(sources["arithmetic_messages.jsonl"], 1.0)], seed=3, shuffle=False)
  expected = [shift(*tokenize_chat(tok, next(reference)["messages"])) for _ in range(20)]
  placed = sorted((r, a) for r in range(2) for a, _ in segments(batch, r))
  assert sum(len(segments(batch, r)) for r in range(2)) >= 4  # several sequences share a row
  k = 0
  for r in range(2):
    segs = segments(batch, r)
    assert segs[0][0] == 0 and all(segs[i][1] == segs[i + 1][0] for i in range(len(segs) - 1))
    end = segs[-1][1]
    assert (batch["segment_ids"][r, end:] == 0).all() and (batch["attention_mask"][r, end:] == 0).all()
    assert (batch["loss_mask"][r, end:] == 0).all() and (batch["attention_mask"][r, :end] == 1).all()
    for a, b in segs:
      tokens, targets, loss = next(e for e in expected if len(e[0]) == b - a and
                                   np.array_equal(e[0], batch["tokens"][r, a:b]))
      np.testing.assert_array_equal(batch["targets"][r, a:b], targets)
      np.testing.assert_array_equal(batch["loss_mask"][r, a:b], loss)
      np.testing.assert_array_equal(batch["positions"][r, a:b], np.arange(b - a))
      # the segment's last targets are its own "<|im_end|>" (trained) and "\n" (not trained)
      assert batch["targets"][r, b - 2] == tok.convert_tokens_to_ids("<|im_end|>")
      assert batch["loss_mask"][r, b - 2] == 1 and batch["loss_mask"][r, b - 1] == 0
      k += 1
  assert k == len(placed)


def random_params(cfg, std=0.5, seed=0):
  """init_params' pytree filled by NumPy (N(0, std) weights, ones for norms) without compiling threefry."""
  shapes = jax.eval_shape(lambda: init_params(cfg, jax.random.PRNGKey(0)))
  rng = np.random.default_rng(seed)
  fill = lambda path, s: (np.ones(s.shape, np.float32) if "norm" in jax.tree_util.keystr(path)
                          else (std * rng.standard_normal(s.shape)).astype(np.float32))
  return jax.tree_util.tree_map_with_path(fill, shapes)


def test_packed_logits_equal_each_sequence_alone(tok, sources):
  mix = Mixture([(sources["units_sharegpt.json"], 1.0)], seed=0)
  batch = next(make_batch_iterator(mix, tok, batch_size=1, max_length=192, packing=True))
  vocab, tokens = np.unique(batch["tokens"], return_inverse=True)  # ids -> a small dense vocabulary
  tokens = tokens.reshape(batch["tokens"].shape).astype(np.int32)
  cfg = ModelConfig(vocab_size=len(vocab), hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4,
                    num_kv_heads=2, head_dim=8, rope_theta=100000.0, tie_word_embeddings=True)
  params = random_params(cfg)
  jitted = jax.jit(lambda w, t, p, m, s: forward(w, cfg, t, positions=p, attention_mask=m, segment_ids=s))
  run = lambda *args: jitted(params, *args)
  packed = np.asarray(run(tokens, batch["positions"], batch["attention_mask"], batch["segment_ids"]))
  segs = segments(batch, 0)
  assert len(segs) >= 2
  alone_tokens, alone_mask = np.zeros((len(segs), 192), np.int32), np.zeros((len(segs), 192), np.int32)
  for i, (a, b) in enumerate(segs):
    alone_tokens[i, :b - a], alone_mask[i, :b - a] = tokens[0, a:b], 1
  # alone: default positions (0, 1, ...) and one segment per row, right-padded
  alone = np.asarray(run(alone_tokens, np.tile(np.arange(192, dtype=np.int32), (len(segs), 1)), alone_mask,
                         alone_mask))
  for i, (a, b) in enumerate(segs):
    np.testing.assert_allclose(packed[0, a:b], alone[i, :b - a], atol=2e-5, rtol=1e-4)
  # without segment ids the later sequences would see the earlier ones: the check above has teeth
  leaky = np.asarray(run(tokens, batch["positions"], batch["attention_mask"], batch["attention_mask"]))
  a, b = segs[1]
  assert np.abs(leaky[0, a:b] - alone[1, :b - a]).max() > 1e-3


def test_bucketing_pads_to_the_smallest_bucket(tok, sources):
  mix = Mixture([(sources["strings_prompt_completion.csv"], 1.0)], seed=1)
  it = make_batch_iterator(mix, tok, batch_size=3, max_length=256, packing=False, buckets=(16, 48, 64, 256))
  reference = Mixture([(sources["strings_prompt_completion.csv"], 1.0)], seed=1)
  for _ in range(2):
    batch = next(it)
    seqs = [shift(*tokenize_chat(tok, next(reference)["messages"])) for _ in range(3)]
    longest = max(len(s[0]) for s in seqs)
    assert batch["tokens"].shape[1] == min(b for b in (16, 48, 64, 256) if b >= longest)
    for r, (tokens, targets, loss) in enumerate(seqs):
      n = len(tokens)
      np.testing.assert_array_equal(batch["tokens"][r, :n], tokens)
      np.testing.assert_array_equal(batch["loss_mask"][r, :n], loss)
      assert (batch["segment_ids"][r, :n] == 1).all() and (batch["segment_ids"][r, n:] == 0).all()


def test_truncation_policies(tok):
  msgs = [{"role": "user", "content": "Tell me the numbers."},
          {"role": "assistant", "content": " ".join(str(i) for i in range(60))}]
  ids, assistant = tokenize_chat(tok, msgs)
  src = load_source([{"messages": msgs}])
  max_length = len(ids) - 11
  for policy, keep in (("right", slice(0, max_length + 1)), ("left", slice(-(max_length + 1), None))):
    it = make_batch_iterator(Mixture([(src, 1.0)]), tok, 1, max_length, packing=False, truncation=policy)
    batch = next(it)
    tokens, targets, loss = shift(ids[keep], assistant[keep])
    np.testing.assert_array_equal(batch["tokens"][0], tokens)
    np.testing.assert_array_equal(batch["loss_mask"][0], loss)
    assert it.stats["truncated"] == 1
  keep_short = load_source([{"messages": [{"role": "user", "content": "Hi"},
                                          {"role": "assistant", "content": "Hello."}]}])
  it = make_batch_iterator(Mixture([(src, 0.5), (keep_short, 0.5)]), tok, 2, max_length, truncation="drop")
  batch = next(it)
  assert it.stats["dropped_too_long"] > 0
  assert batch["segment_ids"].max() >= 1 and batch["attention_mask"].sum(1).max() < len(ids)


def test_mixture_frequencies_and_epochs():
  def rows(tag, n):
    return load_source([{"prompt": f"{tag}{i}", "completion": "ok"} for i in range(n)], name=tag)
  weights = {"a": 0.5, "b": 0.3, "c": 0.2}
  mix = Mixture([(rows("a", 7), 5), (rows("b", 11), 3), (rows("c", 13), 2)], seed=0)
  drawn = [next(mix) for _ in range(4000)]
  for tag, w in weights.items():
    frac = sum(d["source"] == tag for d in drawn) / len(drawn)
    assert abs(frac - w) < 0.03, (tag, frac, w)
  a = [d["messages"][0]["content"] for d in drawn if d["source"] == "a"]
  epochs = [sorted(a[i:i + 7]) for i in range(0, 21, 7)]
  assert all(e == [f"a{i}" for i in range(7)] for e in epochs)  # each epoch visits every row once
  assert a[:7] != a[7:14]  # and is reshuffled
  again = Mixture([(rows("a", 7), 5), (rows("b", 11), 3), (rows("c", 13), 2)], seed=0)
  assert [next(again)["messages"] for _ in range(50)] == [d["messages"] for d in drawn[:50]]
  other = Mixture([(rows("a", 7), 5), (rows("b", 11), 3), (rows("c", 13), 2)], seed=1)
  assert [next(other)["messages"] for _ in range(50)] != [d["messages"] for d in drawn[:50]]


def test_build_mixture_from_config_entries(tmp_path):
  (tmp_path / "x.jsonl").write_text('{"prompt": "p", "completion": "c"}\nnot json\n')
  mix = build_mixture([{"source": "sample:units_sharegpt.json", "weight": 0},
                       {"source": str(tmp_path / "x.jsonl"), "on_bad_row": "skip", "weight": 2}], seed=0)
  assert mix.sources[0].schema == "sharegpt" and mix.sources[1].num_skipped == 1
  assert {next(mix)["source"] for _ in range(20)} == {str(tmp_path / "x.jsonl")}  # weight 0: never drawn
  with pytest.raises(ValueError, match="entry 0 has no 'source'"):
    build_mixture([{"weight": 1}])


def test_mixture_resume_continues_exactly(sources):
  make = lambda: Mixture([(sources["arithmetic_messages.jsonl"], 2), (sources["units_sharegpt.json"], 1)], 7)
  mix = make()
  for _ in range(1500):  # past a choice block and past an epoch of the second source
    next(mix)
  state = json.loads(json.dumps(mix.state()))
  expected = [next(mix) for _ in range(30)]
  resumed = make()
  resumed.restore(state)
  assert [next(resumed) for _ in range(30)] == expected


@pytest.mark.parametrize("packing", [True, False])
def test_iterator_resume_gives_identical_batches(tok, sources, packing):
  def make():
    mix = Mixture([(sources["arithmetic_messages.jsonl"], 1), (sources["strings_prompt_completion.csv"], 1)],
                  seed=5)
    return make_batch_iterator(mix, tok, batch_size=2, max_length=128, packing=packing)
  it = make()
  for _ in range(3):
    next(it)
  state = json.loads(json.dumps(it.state()))
  expected = [next(it) for _ in range(3)]
  resumed = make()
  resumed.restore(state)
  for want in expected:
    got = next(resumed)
    for k in KEYS:
      np.testing.assert_array_equal(got[k], want[k])
  assert resumed.state() == it.state()
