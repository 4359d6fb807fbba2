"""What the papers' verl trainers do without a flag saying so, shared by the paper configs: the FSDP actor
(every parameter trained, float32 master weights, bf16 compute: `fsdp_workers.py`, `torch_dtype =
torch.float32 if self._is_actor`, MixedPrecision(param_dtype=bf16)) and its AdamW (betas (0.9, 0.999),
weight_decay 1e-2, grad_clip 1.0, a constant lr after a linear warmup of lr_warmup_steps_ratio x steps)."""
from configs import common


def actor(config, *, params="full", master_dtype="float32"):
  """config.train as verl's actor (every parameter trained, sharded over mesh.fsdp, float32 master
  parameters, bf16 compute) and a dense bf16 base."""
  common.train(config, params=params, master_dtype=master_dtype)
  config.model.update(quant="none", dtype="bfloat16")  # full training: no quantised base; bf16 compute
  return config


def adamw(config, *, learning_rate, warmup_steps, optimizer_steps):
  """config.optimizer as verl's AdamW with a constant schedule after warmup; steps count optimizer updates."""
  o = config.optimizer
  o.learning_rate = learning_rate  # actor.optim.lr
  o.warmup_steps = warmup_steps  # int(lr_warmup_steps_ratio x total steps), in optimizer updates
  o.end_lr_ratio = 1.0  # warmup_style constant
  o.b1 = 0.9  # AdamW betas (0.9, 0.999) (fsdp_workers.py)
  o.b2 = 0.999
  o.weight_decay = 0.01  # AdamW weight_decay 1e-2 (fsdp_workers.py)
  o.grad_clip = 1.0  # actor.grad_clip (yaml default)
  o.num_steps = optimizer_steps  # rollout batches x optimizer steps a batch (prompts_per_step / mini_batch_size)
  return config
