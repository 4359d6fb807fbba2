"""config.model.remat: the per-layer `jax.checkpoint` policy of `fineflax.models.decoder.forward_hidden`, by
name or by the activations it keeps (the names the decoder layer gives them with `checkpoint_name`)."""
from __future__ import annotations

import jax

LAYER_INPUT = "layer_input"  # checkpoint name of each layer's input (the residual stream entering it)

# config.model.remat -> the per-layer `jax.checkpoint` policy:
#   none     no rematerialisation (every activation the backward pass reads is kept)
#   full     only each layer's input is kept ([L, B, T, H] on the device); the layer is recomputed
#   dots     matmul outputs without batch dimensions are kept, the rest recomputed
#   offload  as full, but each layer's input is copied to pinned host memory in the forward pass and back
#            in the backward pass: the [L, B, T, H] residual stack leaves the device (PCIe traffic instead)
#   attn     named (REMAT_NAMES): q / k / v after rope and the attention output kept (the fused attention
#            is not rerun for its inputs); o, the norms and the MLP recomputed (2 of its 3 matmuls)
#   matmuls  named: the outputs of the projections the backward pass reads and the attention output kept
#            (q / k / v, attn, gate, up; o's and down's outputs only enter residual adds, which keep nothing);
#            only the norms and act(gate)·up recomputed: "dots" that also keeps the attention output
#   save:a,b the layer input and the named activations a, b, ... of REMAT_NAMES kept, the rest recomputed
# Activations a layer names (checkpoint_name), with their width per token: qkv (Dq + 2 Dkv), attn (Dq), gate (I),
# up (I), mlp (act(gate)·up: I) (fineflax.jobs.memory_plan counts them).
REMAT_NAMES = ("qkv", "attn", "gate", "up", "mlp")
REMAT_NAMED = {"attn": ("qkv", "attn"), "matmuls": ("qkv", "attn", "gate", "up")}
REMAT_POLICIES = {
    "none": None,
    "full": jax.checkpoint_policies.nothing_saveable,
    "dots": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
    "offload": jax.checkpoint_policies.save_and_offload_only_these_names(
        names_which_can_be_saved=[], names_which_can_be_offloaded=[LAYER_INPUT],
        offload_src="device", offload_dst="pinned_host"),
    **{k: jax.checkpoint_policies.save_only_these_names(*v) for k, v in REMAT_NAMED.items()},
}


def remat_saved_names(remat: str) -> tuple[str, ...] | None:
  """The activation names a named policy keeps ("attn", "matmuls" or "save:a,b"); None for the others.
  ValueError (one line) naming an unknown name."""
  if remat in REMAT_NAMED:
    return REMAT_NAMED[remat]
  if not remat.startswith("save:"):
    return None
  names = tuple(n.strip() for n in remat[len("save:"):].split(",") if n.strip())
  bad = [n for n in names if n not in REMAT_NAMES]
  if bad or not names:
    raise ValueError(f"remat={remat!r}: {', '.join(bad) or 'no name'} is not an activation name; "
                     f"choose from {', '.join(REMAT_NAMES)}")
  return names


def remat_policy(remat: str):
  """The `jax.checkpoint` policy of config.model.remat (REMAT_POLICIES, or "save:a,b": the named activations
  a, b kept); ValueError for an unknown value."""
  if remat in REMAT_POLICIES:
    return REMAT_POLICIES[remat]
  names = remat_saved_names(remat)
  if names is None:
    raise ValueError(f"remat={remat!r}; choose one of {sorted(REMAT_POLICIES)} or save:NAME,... ({', '.join(REMAT_NAMES)})")
  return jax.checkpoint_policies.save_only_these_names(*names)
