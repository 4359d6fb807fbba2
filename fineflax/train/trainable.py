"""What a job trains (`config.train.params`): LoRA adapters on a frozen base, or every parameter.

  "lora"  (default) the trainable pytree is the LoRA; the base is frozen (quantised or not) and passed
          beside it; the KL reference is the base with the adapters off; the export is a PEFT adapter.
  "full"  the trainable pytree is the whole model, stored in `config.train.master_dtype` ("bfloat16":
          bf16 parameters; "float32": f32 master parameters, computed in `config.model.dtype`); AdamW
          moments are stored in `config.train.moment_dtype` (float32 default, or bfloat16: half the
          optimizer bytes) and computed in float32 either way (`fineflax.train.optim.with_f32_state`). No base is passed
          (base=None); the KL reference is a frozen copy of the initial parameters; rollouts read the
          current parameters directly; the export is a merged Hugging Face folder. Needs
          `config.model.quant="none"`.
          The jitted steps donate the train state (`Trainable.donate`): XLA writes the new params and
          moments into the old ones' buffers, so the update holds one copy of them instead of two; the
          old state is deleted by the step and only the returned one may be read.

The steps take (trainable, base, ...) and read the model through `model_weights`: base=None means the
trainable pytree is the model itself. On a mesh, full parameters and their optimizer state are split
over the "fsdp" axis (every divisible array: `fineflax.mesh.fsdp_shardings` with min_size=0), LoRA and
its state are replicated (`state_shardings`); `init_placed_state` builds the optimizer state directly in
those shardings, so no device ever holds a whole copy of it.
"""
from __future__ import annotations

import dataclasses
import functools
import os
from typing import Any

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P

from fineflax.config_checks import ConfigError, lookup, one_of
from fineflax.mesh import fsdp_shardings, put, replicate, shard_params
from fineflax.train.sections import TrainSection
from fineflax.train.state import State, init_state

TRAIN_PARAMS = ("lora", "full")
MASTER_DTYPES = ("bfloat16", "float32")


# The functions below take `train`: the typed config.train (`fineflax.train.sections.TrainSection`, as the RL
# job passes it), or a job's ConfigDict, read through TrainSection.of (the jobs not converted yet).

def train_params(train: TrainSection) -> str:
  """config.train.params ("lora" when the config has no train section)."""
  return TrainSection.of(train).params


def is_full(train: TrainSection) -> bool:
  return train_params(train) == "full"


def master_dtype(train: TrainSection):
  """The jnp dtype full parameters are stored and updated in (config.train.master_dtype)."""
  return jnp.dtype(TrainSection.of(train).master_dtype)


def moment_dtype(train: TrainSection) -> str:
  """The dtype AdamW's moments are stored in (config.train.moment_dtype, "float32" when absent), for
  `fineflax.train.optim.make_optimizer`; LoRA and full training alike."""
  return TrainSection.of(train).moment_dtype


def loss_head(train: TrainSection) -> str:
  """The SFT loss head (config.train.loss_head, "chunked" when absent): `fineflax.train.sft_step.sft_nll`."""
  return TrainSection.of(train).loss_head


LOSS_HEADS = ("chunked", "fused")  # config.train.loss_head (train.sft_step: chunked_token_logp or fused_weighted_nll)

def validate(config) -> None:
  """config.train.params / master_dtype / moment_dtype in their domains; full training of a quantised base or from a
  LoRA start is refused naming the knob to change (ConfigError, one line)."""
  if config.get("train") is None:
    return
  one_of(config, "train.params", TRAIN_PARAMS)
  one_of(config, "train.master_dtype", MASTER_DTYPES)
  if "moment_dtype" in config.train:
    from fineflax.train.optim import MOMENT_DTYPES
    one_of(config, "train.moment_dtype", MOMENT_DTYPES)
  if "loss_head" in config.train:
    one_of(config, "train.loss_head", LOSS_HEADS)
  if not is_full(config):
    return
  quant = lookup(config, "model.quant", "none")
  if quant != "none":
    raise ConfigError(f"config.model.quant={quant!r}: config.train.params='full' trains every weight of a "
                      f"dense model; set config.model.quant=none (or config.train.params=lora for QLoRA)")
  init_from = lookup(config, "lora.init_from", "")
  if init_from:
    raise ConfigError(f"config.lora.init_from={init_from!r}: a LoRA start does not apply to "
                      f"config.train.params='full'; set config.lora.init_from='' or config.train.params=lora")


def model_weights(trainable, base):
  """(params the model reads, LoRA or None) of a step's (trainable, base) arguments.

  base None: `trainable` is the whole model (full mode), no LoRA. Otherwise the frozen `base` with the
  LoRA `trainable` (None: the base alone, e.g. the LoRA-mode KL reference)."""
  if base is None:
    if trainable is None:
      raise ValueError("model_weights: no weights (trainable and base are both None)")
    return trainable, None
  return base, trainable


@dataclasses.dataclass
class Trainable:
  """The starting point of a training job, from `split_model`.

  params     the initial trainable pytree (LoRA, or the full model in the master dtype)
  base       the frozen base the LoRA adapts; None in full mode (what the steps' `base` argument gets)
  reference  the trainable argument whose log-probs are the KL reference: None (the base with adapters
             off) in LoRA mode, a frozen copy of the initial parameters (compute dtype) in full mode
  full       config.train.params == "full"
  donate     whether the jitted steps donate the train state: full mode (the state is the model and its
             moments; LoRA mode keeps the small state undonated)
  """
  params: Any
  base: Any
  reference: Any
  full: bool

  @property
  def donate(self) -> bool:
    return self.full

  def place(self, mesh) -> "Trainable":
    """The same on `mesh`: a frozen base split over fsdp (`shard_params`); full parameters and the
    reference split over fsdp (every divisible array); a LoRA replicated. No mesh: unchanged."""
    if mesh is None:
      return self
    if not self.full:
      return dataclasses.replace(self, params=replicate(self.params, mesh), base=shard_params(self.base, mesh))
    split = lambda tree: jax.tree.map(put, tree, trainable_shardings(tree, mesh, True))
    reference = None if self.reference is None else split(self.reference)  # never the params' arrays
    return dataclasses.replace(self, params=split(self.params), reference=reference)

  def weights(self, trainable):
    """(params, lora) the model reads for this job's trainable pytree `trainable` (`model_weights`);
    what a Policy / sampler gets: full mode -> (trainable, None), LoRA mode -> (base, trainable)."""
    return model_weights(trainable, self.base)


def split_model(train: TrainSection, base, lora, *, keep_reference: bool = False) -> Trainable:
  """The `Trainable` of config.train.params from `setup_model`'s (base, lora).

  Full mode: the base (dense, compute dtype) becomes the trainable parameters cast to the master dtype;
  `keep_reference` keeps the initial parameters as the frozen reference (rl.beta > 0, a PPO critic's
  base, a teacher that is the student's base): never the trainable arrays themselves, which the first
  step donates (`Trainable.donate`): the base when the dtypes differ, else a copy of it (the copy
  the undonated steps held from step 1 on anyway)."""
  if not is_full(train):
    return Trainable(lora, base, None, False)
  dtype = master_dtype(train)
  cast = lambda x: x.astype(dtype) if jnp.issubdtype(x.dtype, jnp.floating) and x.dtype != dtype else x
  params = jax.tree.map(cast, base)
  same = all(a is b for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(base)))
  reference = (jax.tree.map(jnp.copy, base) if same else base) if keep_reference else None
  return Trainable(params, None, reference, True)


def trainable_shardings(tree, mesh, full: bool):
  """The shardings of a trainable pytree (or its optimizer state) on `mesh`: full -> every divisible
  array split over fsdp; LoRA -> replicated."""
  if full:
    return fsdp_shardings(tree, mesh, min_size=0)
  return jax.tree.map(lambda _: NamedSharding(mesh, P()), tree)


def state_shardings(state: State, mesh, full: bool) -> State:
  """The shardings of a train state (arrays or shape structs) on `mesh`: params and opt_state by
  `trainable_shardings`, step and rng replicated."""
  out = jax.tree.map(lambda _: NamedSharding(mesh, P()), state)
  return dict(out, params=trainable_shardings(state["params"], mesh, full),
              opt_state=trainable_shardings(state["opt_state"], mesh, full))


def init_opt_state(params, optimizer, mesh, full: bool):
  """optimizer.init(params), on `mesh` computed by a jit whose out_shardings are `trainable_shardings`
  (the moments are never whole on one device); no mesh: plain."""
  if mesh is None:
    return optimizer.init(params)
  shardings = trainable_shardings(jax.eval_shape(optimizer.init, params), mesh, full)
  return jax.jit(optimizer.init, out_shardings=shardings)(params)


def init_placed_state(params, optimizer, seed: int, mesh, full: bool) -> State:
  """`init_state` on `mesh` (None: plain `init_state`): `params` placed by `trainable_shardings`, the
  optimizer state by `init_opt_state`, step and rng replicated."""
  if mesh is None:
    return init_state(params, optimizer, seed)
  params = jax.tree.map(put, params, trainable_shardings(params, mesh, full))
  rest = jax.tree.map(lambda x: put(x, NamedSharding(mesh, P())), init_state({}, optimizer, seed))
  return dict(rest, params=params, opt_state=init_opt_state(params, optimizer, mesh, full))


def pin_state(step_fn, state: State, donate: bool = False):
  """`step_fn(state, ...) -> (state, metrics)` jitted with out_shardings keeping the new state in the
  shardings of `state` (sharding propagation alone may move a split array), donating the state when
  `donate` (`Trainable.donate`; `step_fn` must have been made donating too). A fully replicated state
  (LoRA) is left to propagation, which keeps it replicated: `step_fn` is returned as it is."""
  shardings = jax.tree.map(lambda x: x.sharding, state)
  if all(s.is_fully_replicated for s in jax.tree.leaves(shardings)):
    return step_fn
  return jax.jit(step_fn, out_shardings=(shardings, None), donate_argnums=(0,) if donate else ())


def export_trained(trainable: Trainable, params, *, lora_cfg, model_config, tokenizer, config,
                   workdir: str) -> tuple[str, str]:
  """(summary key, path) of the trained model's export, written by process 0 only: LoRA mode -> the PEFT
  adapter in WORKDIR/adapter (`export_adapter`); full mode -> a merged Hugging Face folder
  (model.safetensors, config.json, tokenizer) in WORKDIR/model (`fineflax.lora.export_hf`)."""
  from fineflax.train.distributed import is_writer
  from fineflax.train.model_setup import export_adapter
  if not trainable.full:
    return "adapter", export_adapter(params, lora_cfg, model_config, config, workdir)
  path = os.path.join(workdir, "model")
  if jax.process_count() > 1:  # every process joins the gather of the shards
    from jax.experimental import multihost_utils
    gathered = multihost_utils.process_allgather(params, tiled=True)
  else:
    gathered = jax.device_get(params)
  if is_writer():
    from fineflax.lora import export_hf
    export_hf(gathered, model_config, tokenizer, path)
  return "model", path
