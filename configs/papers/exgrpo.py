"""ExGRPO (Zhan et al. 2025, "Learning to Reason from Experience") as released, knob for knob.

Source: `ExGRPO/exp_scripts/run_exgrpo.sh` of github.com/ElliottYan/LUFFY (the official ExGRPO code), last
changed in commit 476c4fbf26b3e70a23a0523bd69f0fcb4b869771 (2025-10-03; read at HEAD
01f4ae066249e6965ce0d5512ccdf99a12895c74). The script leaves MODEL_PATH empty: ExGRPO's README names
Elliott/Qwen2.5-Math-7B-16k-think for its main (Qwen2.5-Math-7B) results. Its other knobs equal LUFFY's
train.sh (configs/papers/luffy.py, same verl defaults); only the question field of openr1.parquet is used
(ExGRPO README: no external R1 trajectory in training).
The README's "Paper recipes" table maps every flag to its key here (tests/test_paper_configs.py checks it).

  python launch.py --config configs/papers/exgrpo.py --dry_run --devices 8 --device_memory_gb 80
Not supported beyond LUFFY's list: the experience knobs fineflax fixes rather than exposes (exp_metric=ent
with exp_select_mode=argmin: the stored trajectory of lowest entropy under the current policy is replayed;
exp_sample_range=all; exp_is_correct=True: replayed rows are importance-corrected with their recorded
log-probs; experience_lbound=0 / experience_rbound=7: a question with 0 correct rollouts is not stored, one
with all 8 is retired: fineflax/rl/experience.py).
"""
from configs import common
from configs.papers import luffy

EXPERIENCE_FLAGS = ("trainer.experience", "trainer.exp_metric", "trainer.exp_select_mode",
                    "trainer.exp_sample_range", "trainer.exp_bucket_manager", "trainer.experience_ratio",
                    "trainer.experience_start_sratio", "trainer.exp_is_correct", "trainer.experience_lbound",
                    "trainer.experience_rbound")
# the flags of run_exgrpo.sh (the README table has a row for each): LUFFY's train.sh flags, the experience ones,
# a save path, skip_grad_bound, and total_training_steps instead of total_epochs
SCRIPT_FLAGS = (EXPERIENCE_FLAGS + tuple(f for f in luffy.SCRIPT_FLAGS if f != "trainer.total_epochs")
                + ("trainer.default_local_dir", "actor_rollout_ref.actor.skip_grad_bound",
                   "trainer.total_training_steps"))


def get_config(arg: str = ""):
  config = luffy.get_config("")  # the same data, model, verl actor, batch sizes and loss settings
  config.num_steps = 701  # trainer.total_training_steps
  r = config.rl
  del r["luffy"]  # no external trajectories: the off-policy rows are replayed experience
  r.objective = "exgrpo"  # trainer.experience=True (the off-policy loss of replayed rows)
  common.exgrpo_section(r, beta=0.1, sigma=1.0, threshold=0.35, share=0.5)
  # exgrpo.beta 0.1: off_policy_reshape="p_div_p_0.1" on replayed rows; sigma 1: exp_bucket_manager=normal;
  # threshold 0.35: experience_start_sratio; share 0.5: experience_ratio
  r.skip_grad_bound = 500.0  # +actor_rollout_ref.actor.skip_grad_bound=500: skip steps with grad norm above it
  return common.apply_presets(config, arg, {})
