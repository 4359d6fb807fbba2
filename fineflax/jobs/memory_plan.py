"""Fit before run: the per-device memory of a run's rollout phase and update phase on its mesh, from the
model's architecture and the config alone (the verdict and the one-line refusal: `plan_verdict`).

Notation (bytes, per device): n = data x fsdp devices; P = parameters (`ModelConfig.num_params`), P_lin =
those of the seven linears (what QLoRA quantises), P_L = one layer's, P_a = LoRA parameters (rank r on the
targeted linears); L layers, H hidden, I intermediate, D_q = heads x head_dim, D_kv = kv heads x head_dim,
V vocabulary; b = bytes of the compute dtype (2 bf16, 4 f32); b_m = bytes of a trainable parameter (full:
2 with train.master_dtype=bfloat16, 4 with float32; LoRA: 4); b_o = bytes of one AdamW moment (4 with
train.moment_dtype=float32, 2 with bfloat16); s = fsdp for full training (parameters, gradients and AdamW
state sharded), 1 for LoRA (replicated).

Resident in both phases:
  base weights     LoRA: ((P - P_lin)·b + P_lin·q) / fsdp, q = b (quant none), 1 (int8), NF4_BITS / 8 (nf4);
                   full: P·b_m / fsdp (the trained parameters are the base)
  trainable        LoRA: P_a·4
  optimizer        2·b_o·P_t / s + 4·c: AdamW mu and nu for the P_t trainable parameters, c int32 counters
                   of the optax chain (`OPTIMIZER_COUNTERS`: adam's and the schedule's)
  reference        full training with a KL term (rl.beta > 0, or PPO's KL in the reward): P·b / fsdp, a frozen
                   copy; LoRA: none (the reference is the base with adapters off)
  critic (PPO)     rl.ppo.critic=full: (P + H)·b_m / fsdp parameters + their optimizer (2·b_o·(P + H) / fsdp);
                   lora: a second adapter P_a·4 + value head H·4 and their optimizer
Rollout phase adds, with t = mesh.model (the devices of each tensor-parallel rollout engine, one per group of t
devices, `fineflax.rl.learner`):
  t = 1, fsdp > 1, quantised LoRA base:
  gathered base    (1 - 1/fsdp) x the base: a decode step without a model axis reads every weight on every
                   device; a quantised kernel is split over fsdp along its flat codes, which the dequantisation
                   cannot be partitioned through, and XLA may keep the whole gathered base for the decode loop
                   (the 70B shape with fsdp=4 on 4 x H200 asked for 90.8 GiB in decode; with fsdp=2 on
                   2 x H100 the measured peak, 28.0 GiB, stayed under this bound): an upper bound. Dense bases
                   are split along a matrix axis that the decode partitions (no term)
  t > 1:
  rollout weights  the base in the rollout layout, a second copy (one a group): LoRA ((P - P_lin)·b + P_row·q + P_col·q_c) / t,
                   P_col the q / k / v / gate / up parameters, P_row o / down, q_c = 4.5 / 8 for NF4 (column
                   blocks keep f32 block scales, `quant.column_blocks`), else q; full: P·b_m / t (the trained
                   weights re-placed by the rollout's engine)
  dense copy       LoRA on a quantised base with rl.dense_rollouts: P_lin·b / fsdp (t = 1) or / t
  KV pages         rows x (pages(prompt + new) + 1) pages x 16 tokens x 2·L·D_kv·b / t, rows = ceil(R / n)
                   (t = 1: rows and their cache split over every device) or ceil(prompts / (n / t)) x rows a
                   prompt (t > 1: rows split over the n / t tensor-parallel groups in whole prompt groups, each
                   group one engine whose pages split over its t devices' kv heads), R = the rollout rows
                   (prompts_per_step x sampled rows a group: group_size less LUFFY's n_off)
  decode logits    rows·V·4·2 (f32 logits and probabilities of one decode step); / t when t divides V
Update phase adds (full training: the larger of its backward and its optimizer moment, `update_phase`):
  gradients        backward: max(activations + loss head, the gradient), as a micro-batch's activations are freed
                   layer by layer while its gradient appears; the gradient is 4·P_t / s in float32 or, when the
                   update accumulates (always in RL, in SFT when a device's rows exceed one micro-batch:
                   `train.grad_accum`), one micro-batch's b_m·P_t / s beside the 4·P_t / s float32 accumulator;
                   optimizer: the float32 gradient 4·P_t / s, plus new moments 2·b_o·P_t / s when b_o < 4 (the
                   cast result is not written in place). LoRA: P_a·4 beside the activations (the critic's, sized
                   the same, in its own update: the larger of the two updates counts)
  gathered layers  full training with fsdp > 1: 2·P_L·b (one layer's parameters all-gathered, the next prefetched)
  activations      of one micro-batch of T tokens: T = rl.micro_batch_tokens (SFT: train.micro_batch_tokens)
                   or rl.micro_batch_size rows x their tokens,
                   when set, else the optimizer step's rows (rl.mini_batch_size prompts x group_size; SFT:
                   data.batch_size rows) over n devices x their length (prompt + new; SFT: data.max_length).
                   One layer's working set  A = T·b·(4H + 3·D_q + 3·D_kv + 3I)  (its norm inputs and outputs,
                   q / k / v before and after rope, attention output, gate, up, act(gate)·up), plus with XLA
                   attention (model.attention=xla, or auto with an f32 compute dtype; cuDNN's fused kernel keeps
                   none) the f32 scores and probabilities  A_s = 2·rows·heads·S²·4  (S = T / rows), and
                     remat none:    L·(A + A_s)                      every layer's working set kept
                     remat dots:    L·T·b·(D_q + 2·D_kv + 2H + 2I) + A + A_s   matmul outputs kept, one layer redone
                     remat full:    L·T·H·b + 2·(A + A_s)            layer inputs kept, one layer redone
                     remat offload: 2·(A + A_s) (L·T·H·b in pinned host memory, not counted)
                     named (attn, matmuls, save:a,b; `models.remat.REMAT_NAMES`): L·T·b·(H + sum of the kept
                                    names' widths) + A + A_s   (qkv D_q + 2·D_kv, attn D_q, gate / up / mlp I)
                   plus the loss head: rows·c·V·4·3 (c = min(model.logits_chunk, completion length) positions
                   of every row: f32 logits, softmax, gradient) + T·H·4 (the kept d loss / d h); with
                   train.loss_head=fused and a trained head (full) + H·V·(4 + b): its gradient summed over the
                   chunks in f32 and kept in the compute dtype until the backward pass (SFT only).
A phase fits when its total is at most the device's memory (`jax.Device.memory_stats()["bytes_limit"]`, or
`--device_memory_gb`). A plan that does not fit names the knobs and values that make it fit (`plan_verdict.refusal`: for
each phase over, the first of model.remat=full, a smaller micro-batch token budget, a larger mesh.model (rollout
phase), a larger mesh.fsdp, fewer rollout prompts, train.params=lora that brings it under).

Validation (tests/test_memory_plan.py, tiny model on CPU): parameter and optimizer bytes equal the real
pytrees' nbytes; the activation terms are within a factor 2 of XLA's `memory_analysis()` of a compiled step.
"""
from __future__ import annotations

import dataclasses
import math

from fineflax.engine.tensor_parallel import COLUMN
from fineflax.models.config import ModelConfig
from fineflax.models.remat import remat_saved_names
from fineflax.models.estimate import NF4_BITS, linear_params, lora_params

GIB = 1024 ** 3
PAGE = 16  # tokens a KV page holds (the engine's page_size)
OPTIMIZER_COUNTERS = 2  # int32 step counters in the optax chain of fineflax.train.optim (adam, schedule)
DEFAULT_PROMPT_TOKENS = 512  # prompt length planned when the config has no plan.prompt_tokens
COLUMN_BLOCK_BITS = 4 + 32 / 64  # NF4 column blocks: codes + f32 block scale (`quant.column_blocks`)
_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


@dataclasses.dataclass(frozen=True)
class PlanInputs:
  """What the plan reads from a config (`inputs_from_config`); `refusal` varies one field at a time."""
  model: ModelConfig
  n_devices: int
  fsdp: int
  tp: int = 1  # config.mesh.model: devices of each tensor-parallel rollout engine (n / tp groups)
  compute_bytes: int = 2
  params: str = "lora"  # lora | full
  master_bytes: int = 2  # bytes of a trained parameter in full mode
  moment_bytes: int = 4  # bytes of one AdamW moment (train.moment_dtype)
  quant: str = "none"
  lora_rank: int = 16
  lora_targets: tuple = ("q", "k", "v", "o", "gate", "up", "down")
  remat: str = "none"
  attention: str = "cudnn"  # cudnn (fused, no score matrix) or xla
  logits_chunk: int = 128
  prompts: int = 0  # rollout prompts a step (0: no rollout phase, as SFT)
  sampled_per_prompt: int = 0  # rows sampled a prompt
  update_rows: int = 1  # rows of one optimizer step
  prompt_tokens: int = DEFAULT_PROMPT_TOKENS
  new_tokens: int = 0  # completion tokens a row (RL); 0 for SFT, whose rows are prompt_tokens long
  micro_batch_tokens: int = 0  # 0 = the whole optimizer step's rows at once
  micro_batch_rows: int = 0  # rl.micro_batch_size: rows per device per micro-batch (when no token budget)
  reference: bool = False  # a frozen copy for the KL term (full training)
  critic: str = ""  # "", lora or full (PPO)
  dense_rollouts: bool = False
  micro_key: str = "rl.micro_batch_tokens"  # the knob that bounds the micro-batch
  loss_head: str = "chunked"  # train.loss_head (SFT): fused keeps the head's gradient from the forward pass

  @property
  def seq(self) -> int:
    return self.prompt_tokens + self.new_tokens


def _lora_trainable(i: PlanInputs) -> int:
  return lora_params(i.model, i.lora_rank, i.lora_targets)


def resident(i: PlanInputs) -> dict[str, float]:
  """Bytes per device of what both phases hold: base weights, trainable, optimizer, reference, critic."""
  c, b = i.model, i.compute_bytes
  P = c.num_params()
  out = {}
  if i.params == "full":
    out["parameters"] = P * i.master_bytes / i.fsdp
    out["optimizer"] = 2 * i.moment_bytes * P / i.fsdp + 4 * OPTIMIZER_COUNTERS
  else:
    out["base_weights"] = base_bytes(i) / i.fsdp
    out["parameters"] = _lora_trainable(i) * 4
    out["optimizer"] = 2 * i.moment_bytes * _lora_trainable(i) + 4 * OPTIMIZER_COUNTERS
  if i.reference and i.params == "full":
    out["reference"] = P * b / i.fsdp
  if i.critic == "full":
    out["critic"] = (P + c.hidden_size) * (i.master_bytes + 2 * i.moment_bytes) / i.fsdp
  elif i.critic == "lora":
    out["critic"] = (_lora_trainable(i) + c.hidden_size) * (4 + 2 * i.moment_bytes)
  return out


def rollout_rows_per_device(i: PlanInputs) -> int:
  """Rows whose KV pages a device holds (with tp > 1 a share of each of its group's rows): t = 1, ceil(R / n);
  t > 1, the rows of the busiest of the n / t tensor-parallel groups, whole prompt groups a group
  (`sampling.replicas.assign_rows`): ceil(prompts / (n / t)) x sampled rows a prompt."""
  if i.tp == 1:
    return math.ceil(i.prompts * i.sampled_per_prompt / i.n_devices)
  return math.ceil(i.prompts / max(i.n_devices // i.tp, 1)) * i.sampled_per_prompt


def kv_bytes(i: PlanInputs) -> float:
  """KV pages of the rollout rows on one device."""
  c = i.model
  pages = math.ceil(i.seq / PAGE) + 1
  per_row = pages * PAGE * 2 * c.num_layers * c.num_kv_heads * c.head_dim * i.compute_bytes
  return rollout_rows_per_device(i) * per_row / i.tp


def base_bytes(i: PlanInputs, column_bits: float | None = None) -> float:
  """Bytes of the whole base (all devices): LoRA, the frozen base (with `column_bits`, the q / k / v / gate / up
  kernels at that many bits a parameter); full, the trained parameters."""
  c, b = i.model, i.compute_bytes
  P, lin = c.num_params(), linear_params(c)
  if i.params == "full":
    return P * i.master_bytes
  q = {"nf4": NF4_BITS / 8, "int8": 1}.get(i.quant, b)
  col = linear_params(c, COLUMN) if column_bits is not None and i.quant != "none" else 0
  return (P - lin) * b + (lin - col) * q + col * (column_bits or 0) / 8


def micro_batch_tokens(i: PlanInputs) -> int:
  """T: tokens per device in one micro-batch of the update."""
  if i.micro_batch_tokens:
    return int(i.micro_batch_tokens)
  if i.micro_batch_rows:
    return int(i.micro_batch_rows) * i.seq
  return math.ceil(i.update_rows / i.n_devices) * i.seq


def activation_bytes(i: PlanInputs, tokens: int | None = None) -> dict[str, float]:
  """Activations of one micro-batch of `tokens` (default `micro_batch_tokens`) under model.remat."""
  c, b = i.model, i.compute_bytes
  T = micro_batch_tokens(i) if tokens is None else tokens
  H, I, L = c.hidden_size, c.intermediate_size, c.num_layers
  dq, dkv = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
  rows = max(1, T // max(i.seq, 1))
  scores = 2 * rows * c.num_heads * (T / rows) ** 2 * 4 if i.attention == "xla" else 0
  layer = T * b * (4 * H + 3 * dq + 3 * dkv + 3 * I) + scores
  names = remat_saved_names(i.remat)
  if names is not None:
    width = {"qkv": dq + 2 * dkv, "attn": dq, "gate": I, "up": I, "mlp": I}
    saved = L * T * b * (H + sum(width[n] for n in names)) + layer
  else:
    saved = {"none": L * layer,
             "dots": L * T * b * (dq + 2 * dkv + 2 * H + 2 * I) + layer,
             "full": L * T * H * b + 2 * layer,
             "offload": 2 * layer}[i.remat]
  head_len = i.new_tokens or i.seq
  head = rows * min(i.logits_chunk, head_len) * c.vocab_size * 4 * 3 + T * H * 4
  if i.loss_head == "fused" and i.params == "full":
    head += H * c.vocab_size * (4 + b)
  return {"activations": saved, "loss_head": head}


def accumulates(i: PlanInputs) -> bool:
  """Whether the update sums micro-batch gradients into a float32 accumulator held through the backward:
  always in RL (`grad_accum.accumulate`), in SFT when a device's rows exceed one micro-batch."""
  per_device = math.ceil(i.update_rows / i.n_devices) * i.seq
  return i.micro_key.startswith("rl.") or micro_batch_tokens(i) < per_device


def update_phase(i: PlanInputs) -> dict[str, float]:
  """Bytes per device at the update's peak, the larger of its two moments (full training):
    backward   a micro-batch's activations and loss head are freed layer by layer as its gradient appears, so
               the two peak one after the other: max(activations + loss head, gradient), beside the float32
               accumulator when the update accumulates (the micro-batch's gradient is then in the master dtype);
    optimizer  the float32 gradient, plus new AdamW moments when they are stored narrower than float32 (computed
               in float32, the cast result is not written in place).
  LoRA: the adapters' float32 gradient beside the activations. Within 15% of `peak_bytes_in_use` on one H200
  (benchmarks/memory_plan_check.py, 2026-11-28)."""
  c = i.model
  out = resident(i)
  if i.params != "full":
    out["gradients"] = _lora_trainable(i) * 4
    out.update(activation_bytes(i))
    return out
  P = c.num_params() / i.fsdp
  if i.fsdp > 1:
    layer = (c.num_params() - c.vocab_size * c.hidden_size * (1 if c.tie_word_embeddings else 2)) / c.num_layers
    out["gathered_layers"] = 2 * layer * i.compute_bytes
  acts, acc = activation_bytes(i), accumulates(i)
  grad_key, grad = ("micro_batch_gradient", i.master_bytes * P) if acc else ("gradients", 4 * P)
  backward = {"gradient_accumulator": 4 * P} if acc else {}
  backward.update(acts if sum(acts.values()) >= grad else {grad_key: grad})
  optimizer = {"gradients": 4 * P, **({"new_moments": 2 * i.moment_bytes * P} if i.moment_bytes < 4 else {})}
  out.update(max(backward, optimizer, key=lambda d: sum(d.values())))
  return out


def rollout_phase(i: PlanInputs) -> dict[str, float]:
  out = resident(i)
  if i.tp > 1:
    out["rollout_weights"] = base_bytes(i, COLUMN_BLOCK_BITS if i.quant == "nf4" else None) / i.tp
  elif i.fsdp > 1 and i.params != "full" and i.quant != "none":
    out["gathered_base"] = base_bytes(i) * (1 - 1 / i.fsdp)
  if i.params != "full" and i.dense_rollouts and i.quant != "none":
    out["dense_copy"] = linear_params(i.model) * i.compute_bytes / (i.tp if i.tp > 1 else i.fsdp)
  out["kv_pages"] = kv_bytes(i)
  vocab_split = i.tp if i.model.vocab_size % i.tp == 0 else 1
  out["decode_logits"] = rollout_rows_per_device(i) * i.model.vocab_size * 4 * 2 / vocab_split
  return out


def phases(i: PlanInputs) -> dict[str, dict[str, float]]:
  """{"rollout": {...}, "update": {...}} bytes per device by term (no rollout phase without prompts)."""
  out = {"rollout": rollout_phase(i)} if i.prompts else {}
  out["update"] = update_phase(i)
  return out


def fits(i: PlanInputs, device_bytes: float) -> bool:
  return all(sum(p.values()) <= device_bytes for p in phases(i).values())


# ----------------------------------------------------------------------------- from a config

def inputs_from_config(config, n_devices: int, data: int, fsdp: int, tp: int = 1) -> PlanInputs | None:
  """The plan's inputs for an RL or SFT job's config on a (data, fsdp) mesh of n_devices, rollouts
  tensor-parallel over tp of them; None for other jobs."""
  from fineflax.models.dtype import resolve_dtype_name
  from fineflax.models.estimate import load_config
  from fineflax.models.targets import resolve_targets
  if config.job not in ("rl", "sft"):
    return None
  train = config.get("train") or {}
  lora = config.get("lora")
  plan = config.get("plan") or {}
  dtype = resolve_dtype_name(config.model.get("dtype", "auto"))
  attention = config.model.get("attention", "auto")
  common = dict(
      model=load_config(config.model.source), n_devices=n_devices, fsdp=fsdp, tp=tp, compute_bytes=_BYTES[dtype],
      attention=("xla" if dtype == "float32" else "cudnn") if attention == "auto" else attention,
      params=train.get("params", "lora"), master_bytes=_BYTES[train.get("master_dtype", "bfloat16")],
      moment_bytes=_BYTES[train.get("moment_dtype", "float32")],
      quant=config.model.get("quant", "none"), lora_rank=lora.r if lora is not None else 0,
      lora_targets=resolve_targets(tuple(lora.targets)) if lora is not None else (),
      remat=config.model.get("remat", "none"), logits_chunk=config.model.get("logits_chunk", 128))
  if config.job == "sft":
    return PlanInputs(**common, update_rows=config.data.batch_size, prompt_tokens=config.data.max_length,
                      loss_head=train.get("loss_head", "chunked"),
                      micro_batch_tokens=train.get("micro_batch_tokens", 0), micro_key="train.micro_batch_tokens")
  rl = config.rl
  objective = rl.get("objective", "grpo")
  n_off = rl.luffy.n_off if objective == "luffy" and rl.get("luffy") is not None else 0
  ppo = rl.get("ppo") if objective == "ppo" else None
  kl = (rl.get("beta", 0.0) > 0) or (ppo is not None and ppo.get("kl_in_reward", False) and ppo.get("kl_coef", 0) > 0)
  mini = rl.get("mini_batch_size", 0) or rl.prompts_per_step
  return PlanInputs(**common, prompts=rl.prompts_per_step, sampled_per_prompt=rl.group_size - n_off,
                    update_rows=mini * rl.group_size,
                    prompt_tokens=int(plan.get("prompt_tokens", DEFAULT_PROMPT_TOKENS)),
                    new_tokens=rl.max_new_tokens, micro_batch_tokens=rl.get("micro_batch_tokens", 0),
                    micro_batch_rows=rl.get("micro_batch_size", 0),
                    reference=kl, critic=ppo.get("critic", "full") if ppo is not None else "",
                    dense_rollouts=bool(rl.get("dense_rollouts", False)))
