"""Quickstart: QLoRA SFT of SmolLM2-135M-Instruct on the bundled arithmetic chats (~3 min on 2 CPU cores).

  python launch.py --config configs/quickstart.py --workdir runs/quickstart
"""
import ml_collections

from configs import common


def get_config():
  config = ml_collections.ConfigDict()
  config.job = "sft"  # fineflax.jobs.sft
  config.seed = 0  # PRNG seed: LoRA init, dropout, data order

  common.model(config, quant="nf4", logits_chunk=256)
  common.lora(config, r=16, alpha=32.0, dropout=0.05)
  common.train(config)  # what is trained: lora (default) or full

  config.data = ml_collections.ConfigDict()
  config.data.sources = "arithmetic_messages.jsonl:1.0"  # "path[:weight],..."; bare names = bundled samples
  config.data.eval_sources = "arithmetic_eval_messages.jsonl"  # held-out set for eval loss; "" = none
  config.data.schema = "auto"  # auto, messages, sharegpt, alpaca, prompt_completion, glaive
  config.data.on_bad_row = "error"  # error (name file and line) or skip (count and go on)
  config.data.batch_size = 8  # rows per micro-batch
  config.data.grad_accum = 1  # micro-batches per optimizer step
  config.data.max_length = 64  # tokens per row
  config.data.packing = False  # pack several conversations into a row (segment ids keep them apart)
  config.data.truncation = "right"  # right, left or drop
  config.data.eval_batches = 2  # batches per evaluation

  common.optimizer(config, num_steps=30, learning_rate=1e-3, warmup_steps=4, end_lr_ratio=0.1, b2=0.999)
  common.mesh(config)
  common.checkpoint(config, every=15, keep_last=2, keep_best=1)

  config.log_every = 5  # steps between logged train metrics
  config.eval_every = 15  # steps between evaluations
  config.sample_prompt = "What is 48 + 37?"  # answered before and after training; "" = skip
  config.sample_max_new_tokens = 32  # tokens for that answer
  return config
