"""Typed `config.model`, `config.train` and `config.mesh` sections (as `fineflax.rl.config.RLConfig` is for
`config.rl`): built once when a job resolves its config and passed down, so the train modules read
typed fields instead of the raw ConfigDict.

`ModelSection.of(config)`, `TrainSection.of(config)` and `MeshSection.of(config)` read the whole
ConfigDict (absent keys and an absent section take the defaults below, those of `configs/common.py`'s
model/train/mesh, or the value the modules read when the section is missing); a section already typed
is returned as is, so a function may be handed either during the conversion (issue 52 item 10).
`Sections.of(config)` builds all three.
"""
from __future__ import annotations

import dataclasses

from fineflax.config_checks import lookup


def _typed(cls, config):
  return config if isinstance(config, cls) else None


@dataclasses.dataclass(frozen=True)
class ModelSection:
  """config.model."""
  source: str  # HF folder, .gguf file, hub name or alias of the base model
  dtype: str = "auto"  # compute dtype name: auto (bfloat16 on GPU/TPU, float32 on CPU), float32 or bfloat16
  quant: str = "none"  # frozen base linears: nf4 (QLoRA), int8 or none
  quant_targets: tuple = ("all-linear",)  # quantised linears: short/HF names or all-linear
  remat: str = "none"  # per-layer gradient checkpointing policy (fineflax.models.remat)
  logits_chunk: int = 0  # tokens per chunk of the vocabulary projection in the loss (0: no chunking)
  attention: str = "auto"  # attention kernel: auto, cudnn or xla
  layer_loop: str = "scan"  # layers as scan, unrolled, or auto (fineflax.models.layer_loop)

  @classmethod
  def of(cls, config) -> "ModelSection":
    """The typed config.model of a job's ConfigDict (a ModelSection is returned as is)."""
    if (typed := _typed(cls, config)) is not None:
      return typed
    m = config.model
    return cls(source=m.source, dtype=m.get("dtype", "auto"), quant=m.get("quant", "none"),
               quant_targets=tuple(m.get("quant_targets", ("all-linear",))), remat=m.get("remat", "none"),
               logits_chunk=m.get("logits_chunk", 0), attention=m.get("attention", "auto"),
               layer_loop=m.get("layer_loop", "scan"))


@dataclasses.dataclass(frozen=True)
class TrainSection:
  """config.train (fineflax/train/trainable.py)."""
  params: str = "lora"  # lora (adapters on the frozen base) or full (every parameter)
  master_dtype: str = "bfloat16"  # full mode: the dtype parameters are stored and updated in
  moment_dtype: str = "float32"  # AdamW mu and nu stored in float32 or bfloat16
  loss_head: str = "chunked"  # SFT loss head: chunked or fused (fineflax.train.sft_step.sft_nll)

  @classmethod
  def of(cls, config) -> "TrainSection":
    """The typed config.train of a job's ConfigDict (defaults when it has no train section)."""
    if (typed := _typed(cls, config)) is not None:
      return typed
    return cls(**{f.name: lookup(config, f"train.{f.name}", f.default) for f in dataclasses.fields(cls)})


@dataclasses.dataclass(frozen=True)
class MeshSection:
  """config.mesh (fineflax.mesh, fineflax.jobs.rl.run_meshes)."""
  data: int = -1  # data-parallel devices (-1: all that fsdp leaves)
  fsdp: int = 1  # devices the weights (full mode: and optimizer state) are split over
  model: int = 1  # RL rollouts: devices one tensor-parallel engine splits the weights and KV cache over
  rollout: int = 0  # async RL: the last N devices decode the rollouts while the others train; 0 = none

  @classmethod
  def of(cls, config) -> "MeshSection":
    """The typed config.mesh of a job's ConfigDict (a MeshSection is returned as is)."""
    if (typed := _typed(cls, config)) is not None:
      return typed
    return cls(**{f.name: int(lookup(config, f"mesh.{f.name}", f.default)) for f in dataclasses.fields(cls)})


@dataclasses.dataclass(frozen=True)
class Sections:
  """The three typed sections of one run, built once at resolve time."""
  model: ModelSection  # config.model
  train: TrainSection  # config.train
  mesh: MeshSection  # config.mesh

  @classmethod
  def of(cls, config) -> "Sections":
    if (typed := _typed(cls, config)) is not None:
      return typed
    return cls(ModelSection.of(config), TrainSection.of(config), MeshSection.of(config))
