"""Model setup shared by the jobs: one target grammar for LoRA and NF4 quantisation."""
import pytest

from fineflax.train.model_setup import setup_model
from fineflax.jobs.resolve import load_config
from fineflax.quant import is_quantized


@pytest.mark.parametrize("targets,adapted", [("('all-linear',)", {"q", "k", "v", "o", "gate", "up", "down"}),
                                             ("('q_proj','v_proj')", {"q", "v"})])
def test_lora_targets_in_any_grammar_work_with_an_nf4_base(tiny_smol, targets, adapted):
  c = load_config("configs/grpo_arith.py:smoke", [f"model.source={tiny_smol}", f"lora.targets={targets}",
                                                   "model.quant=nf4"])
  base, _, _, _, lora = setup_model(c)
  assert set(lora) == adapted
  assert all(is_quantized(base["layers"][n]["kernel"]) for n in ("q", "k", "v", "o", "gate", "up", "down"))


def test_quant_targets_pick_the_quantised_linears(tiny_smol):
  c = load_config("configs/grpo_arith.py:smoke", [f"model.source={tiny_smol}", "model.quant=nf4",
                                                   "model.quant_targets=('gate_proj','up_proj','down_proj')"])
  base, _, _, _, _ = setup_model(c)
  assert [n for n in ("q", "k", "v", "o", "gate", "up", "down") if is_quantized(base["layers"][n]["kernel"])] \
      == ["gate", "up", "down"]
