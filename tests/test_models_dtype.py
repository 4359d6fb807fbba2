"""The compute dtype defaults to what is fast on the backend in use (fineflax/models/dtype.py): float32 on
CPU, bfloat16 on GPUs and TPUs, for every job whose config does not set it and for the server; an explicit
value wins; a run's saved config holds the resolved dtype, so resuming on another backend is refused."""
import glob
import os

import jax.numpy as jnp
import pytest

from fineflax.train.model_setup import compute_dtype
from fineflax.jobs.resolve import load_config
from fineflax.models.dtype import resolve_dtype, resolve_dtype_name
from fineflax.train.run_config import ConfigChanged, check_resumable

pytestmark = pytest.mark.fast

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_auto_is_float32_on_cpu_and_bfloat16_on_accelerators_and_explicit_values_win():
  assert resolve_dtype_name("auto", "cpu") == "float32"
  assert resolve_dtype_name("auto", "gpu") == resolve_dtype_name("auto", "tpu") == "bfloat16"
  assert resolve_dtype_name("bfloat16", "cpu") == "bfloat16" and resolve_dtype_name("float32", "gpu") == "float32"
  assert resolve_dtype("auto") == jnp.float32  # the tests run on CPU
  with pytest.raises(ValueError, match="dtype 'float16'; choose one of auto, float32, bfloat16"):
    resolve_dtype_name("float16")


def test_every_config_leaves_the_dtype_to_the_backend_unless_a_cpu_preset_sets_it():
  names = [os.path.relpath(p, ROOT) for p in sorted(glob.glob(os.path.join(ROOT, "configs", "*.py")))
           if not p.endswith(("common.py", "__init__.py"))]
  assert len(names) >= 8
  for name in names:
    config = load_config(name)
    assert config.model.dtype == "auto", name
    assert compute_dtype(config) == jnp.float32, name  # CPU: float32, not the slow bfloat16
  assert compute_dtype(load_config("configs/quickstart.py", ["model.dtype=bfloat16"])) == jnp.bfloat16


def test_the_server_defaults_to_auto():
  from fineflax.serve.__main__ import parse_args
  assert parse_args(["--model", "m"]).dtype == "auto"
  assert parse_args(["--model", "m", "--dtype", "bfloat16"]).dtype == "bfloat16"


def test_the_saved_config_holds_the_resolved_dtype(tmp_path, monkeypatch):
  import json
  from fineflax.models import dtype as dtype_lib
  check_resumable(load_config("configs/quickstart.py"), str(tmp_path))  # on CPU: auto -> float32
  assert json.loads((tmp_path / "config.json").read_text())["model"]["dtype"] == "float32"
  (tmp_path / "checkpoints" / "2").mkdir(parents=True)
  check_resumable(load_config("configs/quickstart.py", ["model.dtype=float32"]), str(tmp_path))  # the same run
  monkeypatch.setattr(dtype_lib.jax, "default_backend", lambda: "gpu")  # the same workdir on a GPU
  with pytest.raises(ConfigChanged, match=r"model.dtype: 'float32' -> 'bfloat16'"):
    check_resumable(load_config("configs/quickstart.py"), str(tmp_path))
