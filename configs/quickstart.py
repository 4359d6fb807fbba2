"""Quickstart: QLoRA SFT of SmolLM2-135M-Instruct on the bundled arithmetic chats (~3 min on 2 CPU cores).

  python launch.py --config configs/quickstart.py --workdir runs/quickstart
"""
import ml_collections


def get_config():
  config = ml_collections.ConfigDict()
  config.job = "sft"  # fineflax.jobs.sft
  config.seed = 0  # PRNG seed: LoRA init, dropout, data order

  config.model = ml_collections.ConfigDict()
  config.model.source = "smollm2-135m-instruct"  # HF folder, .gguf file, hub name or alias
  config.model.dtype = "float32"  # compute dtype: float32 (CPU) or bfloat16 (GPU)
  config.model.quant = "nf4"  # frozen base linears: nf4 (QLoRA), int8 or none (plain LoRA)
  config.model.remat = "none"  # per-layer gradient checkpointing: none, full or dots
  config.model.logits_chunk = 256  # tokens per chunk of the vocabulary projection in the loss

  config.lora = ml_collections.ConfigDict()
  config.lora.r = 16  # adapter rank
  config.lora.alpha = 32.0  # scale = alpha / r (alpha / sqrt(r) with rslora)
  config.lora.dropout = 0.05  # dropout on the adapter input
  config.lora.rslora = False  # rank-stabilised scaling
  config.lora.targets = ("q", "k", "v", "o", "gate", "up", "down")  # adapted linears

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

  config.optimizer = ml_collections.ConfigDict()
  config.optimizer.num_steps = 30  # optimizer updates
  config.optimizer.learning_rate = 1e-3  # peak learning rate
  config.optimizer.warmup_steps = 4  # linear warmup
  config.optimizer.end_lr_ratio = 0.1  # cosine decays to this fraction of the peak
  config.optimizer.weight_decay = 0.0  # AdamW decoupled weight decay
  config.optimizer.b1 = 0.9  # Adam beta1
  config.optimizer.b2 = 0.999  # Adam beta2
  config.optimizer.grad_clip = 1.0  # global-norm clip; 0 = off

  config.mesh = ml_collections.ConfigDict()
  config.mesh.data = -1  # data-parallel devices (-1: all that fsdp leaves)
  config.mesh.fsdp = 1  # devices the frozen base weights are split over

  config.checkpoint = ml_collections.ConfigDict()
  config.checkpoint.every = 15  # steps between checkpoints
  config.checkpoint.keep_last = 2  # most recent checkpoints kept
  config.checkpoint.keep_best = 1  # best-by-eval-loss checkpoints kept

  config.log_every = 5  # steps between logged train metrics
  config.eval_every = 15  # steps between evaluations
  config.sample_prompt = "What is 48 + 37?"  # answered before and after training; "" = skip
  config.sample_max_new_tokens = 32  # tokens for that answer
  return config
