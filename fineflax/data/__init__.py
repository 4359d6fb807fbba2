"""Data for SFT: sources, schema mapping, mixing, chat formatting with assistant masks, batches.

  source = load_source("train.jsonl", schema="auto", on_bad_row="error")   # or .json/.parquet/.csv,
                                                                           # "tfds:NAME", a hub name
  mixture = Mixture([(source, 0.7), (sample_file("units_sharegpt.json"), 0.3)], seed=0)
  # or from config entries: build_mixture([{"source": "sample:arithmetic_messages.jsonl", "weight": 1}])
  batches = make_batch_iterator(mixture, tokenizer, batch_size=8, max_length=512, packing=True)
  batch = next(batches); saved = batches.state(); ...; batches.restore(saved)
  batches.summary()   # per source: rows, malformed rows skipped at load, examples kept / truncated / dropped

  python -m fineflax.inspect_data --config configs/quickstart.py    # what a config trains on (see inspect.py)

RL prompts (ground truth, data source, off-policy trace) from the papers' files: `fineflax.data.rl_prompts`
(load_prompts(path, field_map("luffy" | "search_r1" | "gsm8k" | "math")), used by config.env = "dataset").

Batch contract (NumPy, B = batch_size, T = max_length when packing, else a bucket width):

  tokens          int32   [B, T]  input ids; padding holds the pad id
  targets         int32   [B, T]  next token: targets[b, t] = the id after tokens[b, t] in its segment
  loss_mask       float32 [B, T]  1 where targets[b, t] is an assistant token (its content or its
                                  end-of-turn token; never a role header, user/system/tool text or padding)
  attention_mask  int32   [B, T]  1 on real tokens, 0 on padding
  positions       int32   [B, T]  0, 1, ... restarting in each segment; 0 on padding
  segment_ids     int32   [B, T]  1, 2, ... for the sequences packed in a row; 0 = padding

A model sees a packed row as independent sequences when a token attends only to earlier tokens with the
same segment id (as `fineflax.models.forward(..., positions=, attention_mask=, segment_ids=)` does).
Loss = sum(loss_mask * nll(logits, targets)) / sum(loss_mask).
"""
from fineflax.data.chat import CHATML_TEMPLATE, TemplateError, render_with_spans, tokenize_chat
from fineflax.data.iterator import BatchIterator, make_batch_iterator
from fineflax.data.mixture import Mixture, build_mixture
from fineflax.data.packing import assemble, default_buckets, first_fit, shift, truncate
from fineflax.data.prepare import prepare
from fineflax.data.schemas import SCHEMAS, RowError, detect_schema, to_messages
from fineflax.data.sources import DataError, Source, load_source, load_sources, sample_file
