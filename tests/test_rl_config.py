"""RLConfig (fineflax.rl.config): built from every RL config file and preset with the ConfigDict's values,
checked once (a bad field is one ConfigError naming config.rl.KEY, the value and the allowed values);
frozen; keys it does not declare stay readable for an added objective."""
import dataclasses

import pytest

from fineflax.config_checks import ConfigError
from fineflax.jobs.resolve import load_config
from fineflax.rl.config import SECTIONS, ExGRPOConfig, LuffyConfig, RLConfig
from fineflax.rl.importance import resolve_mode

pytestmark = pytest.mark.fast  # the fast tier of main's tests/conftest.py (13 s on 2 cores)

SPECS = ["configs/grpo_arith.py", "configs/grpo_arith.py:dapo,exgrpo", "configs/grpo_arith.py:luffy,smoke",
         "configs/luffy_arith.py:sft_rl,smoke", "configs/search_r1.py:smoke", "configs/agent_rl.py:search_r1",
         "configs/dataset_rl.py:luffy,smoke"]


@pytest.mark.parametrize("spec", SPECS)
def test_every_declared_field_holds_the_config_value(spec):
  c = load_config(spec)
  rl = RLConfig.from_config(c.rl)
  values = c.rl.to_dict()
  for f in dataclasses.fields(RLConfig):
    if f.name in SECTIONS:
      section = getattr(rl, f.name)
      assert (section is None) == (f.name not in values), f.name
      if section is not None:
        assert dataclasses.asdict(section) == values[f.name]
    elif f.name == "importance":  # "auto" is resolved (test_rl_importance)
      assert rl.importance == resolve_mode(values["importance"], values["async_steps"])
    elif f.name != "extra":
      assert getattr(rl, f.name) == values[f.name], f.name
  assert rl.extra == {} and RLConfig.from_config(rl) is rl


@pytest.mark.parametrize("over, message", [
    ({"agg_mode": "bogus"}, "config.rl.agg_mode='bogus': choose one of 'token-mean'"),
    ({"group_size": 1}, "config.rl.group_size=1: group advantages need >= 2"),
    ({"top_p": 0.0}, "config.rl.top_p=0.0: must be in (0.0, 1.0]"),
    ({"dual_clip": 0.5}, "config.rl.dual_clip=0.5: 0 (off) or a constant > 1"),
    ({"sft_steps": -1}, "config.rl.sft_steps=-1: an integer >= 0 (0 = no SFT phase)"),
    ({"objective": "trpo"}, "config.rl.objective='trpo': choose one of 'grpo', 'luffy', 'exgrpo', 'ppo'"),
    ({"decode_impl": "fast"}, "config.rl.decode_impl='fast': choose one of 'scan', 'unrolled', 'auto'"),
    ({"objective": "luffy"}, "config.rl.luffy is missing: objective 'luffy' needs its section"),
    ({"objective": "luffy", "group_size": 4, "luffy": LuffyConfig(n_off=4)},
     "config.rl.luffy.n_off=4: LUFFY needs 1 <= n_off < group_size=4"),
])
def test_a_bad_field_names_key_value_and_allowed_values(over, message):
  with pytest.raises(ConfigError) as e:
    RLConfig(**over)
  assert message in str(e.value) and "\n" not in str(e.value)


def test_sections_check_their_own_fields():
  with pytest.raises(ConfigError, match=r"config.rl.exgrpo.threshold=1.5: must be in \[0.0, 1.0\]"):
    ExGRPOConfig(threshold=1.5)
  with pytest.raises(ConfigError, match=r"config.rl.luffy.gamma=0.0: must be in \(0.0, inf\]"):
    LuffyConfig(gamma=0.0)
  c = load_config("configs/grpo_arith.py:exgrpo", ["rl.exgrpo.share=2.0"])
  with pytest.raises(ConfigError, match=r"config.rl.exgrpo.share=2.0"):
    RLConfig.from_config(c.rl)


def test_frozen_and_undeclared_keys_are_readable():
  import ml_collections
  rl = RLConfig.from_config(ml_collections.ConfigDict({"objective": "grpo", "scale": 2.0}))
  assert rl.scale == 2.0 and rl.extra == {"scale": 2.0} and rl.group_size == 2
  with pytest.raises(dataclasses.FrozenInstanceError):
    rl.group_size = 8
  with pytest.raises(AttributeError, match="config.rl has no field 'nope'"):
    rl.nope


@pytest.mark.fast
def test_the_rollout_decoder_reaches_generate_and_search_r1_sessions(monkeypatch):
  """rl.decode_impl and rl.dense_rollouts travel from the Policy to `generate` and to Search-R1's sessions."""
  from fineflax.envs import search_r1 as env_mod
  from fineflax.rl import policy as policy_mod
  seen = {}
  monkeypatch.setattr(policy_mod, "generate", lambda *a, **kw: seen.setdefault("generate", kw))
  monkeypatch.setattr(env_mod, "rollout_batch", lambda *a, **kw: seen.setdefault("search_r1", kw))
  policy = policy_mod.Policy("base", "cfg", "tok", None, 1.0, dense_base=True, decode_impl="unrolled")
  policy.sample([[1, 2]])
  env = env_mod.SearchR1Env.__new__(env_mod.SearchR1Env)
  env.tok, env.search_fn, env.rollout_cfg = "tok", None, None
  env.results(policy, [], rng=None)
  for kw in seen.values():
    assert kw["impl"] == "unrolled" and kw["dense_base"] is True
  assert RLConfig().decode_impl == "scan"
