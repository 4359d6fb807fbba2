"""`python -m fineflax.serve` user mistakes: a bad --model or --adapter and a busy port are one line and exit
code 2, found before the weights load (the model here has a config but broken weights: an error about
them would mean the load was tried first)."""
import pathlib
import shutil
import socket
import subprocess
import sys

import pytest

from fineflax.testing.serve import tiny_chat_model, write_adapters

ROOT = pathlib.Path(__file__).parents[1]


@pytest.fixture(scope="module")
def broken_model(tmp_path_factory):
  """(a tiny model folder whose weights file is cut short, a PEFT adapter folder that fits it)."""
  root = tmp_path_factory.mktemp("serve_cli")
  good = tiny_chat_model(root)
  adapter = write_adapters(good, root)["alpha"]
  broken = root / "broken"
  shutil.copytree(good, broken)
  weights = broken / "model.safetensors"
  weights.write_bytes(weights.read_bytes()[:1000])
  return str(broken), adapter


def _serve(*args):
  r = subprocess.run([sys.executable, "-m", "fineflax.serve", *args], cwd=ROOT, capture_output=True, text=True,
                     timeout=300)
  assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-3000:]
  lines = r.stderr.strip().splitlines()
  assert len(lines) == 1, lines
  return lines[0]


def test_a_bad_model_or_adapter_is_one_line(broken_model, tmp_path):
  model, adapter = broken_model
  assert _serve("--model", str(tmp_path / "nope"), "--port", "0") == (
      f"error: --model {tmp_path / 'nope'}: '{tmp_path / 'nope'}': no such file or folder, and not a known alias "
      "(smollm2-135m-instruct)")
  line = _serve("--model", model, "--adapter", f"a={tmp_path / 'missing'}", "--port", "0")
  assert line == (f"error: --adapter a={tmp_path / 'missing'}: {tmp_path / 'missing'}: no adapter_config.json "
                  "(is this a PEFT adapter folder?)")
  (tmp_path / "cfg").mkdir()  # an adapter whose files are there but are not a LoRA adapter
  shutil.copy(pathlib.Path(adapter) / "adapter_model.safetensors", tmp_path / "cfg")
  (tmp_path / "cfg" / "adapter_config.json").write_text('{"peft_type": "IA3"}')
  assert "peft_type='IA3'; only 'LORA' adapters are supported" in _serve("--model", model, "--adapter",
                                                                         f"a={tmp_path / 'cfg'}", "--port", "0")


@pytest.mark.fast
def test_a_busy_port_is_found_before_the_model_loads(broken_model, tmp_path):
  model, adapter = broken_model
  with socket.socket() as busy:
    busy.bind(("127.0.0.1", 0))
    busy.listen(1)
    port = busy.getsockname()[1]
    line = _serve("--model", model, "--adapter", f"a={adapter}", "--port", str(port),
                  "--log", str(tmp_path / "log.sqlite"))
  assert line.startswith(f"error: cannot listen on 127.0.0.1:{port}: ")
  assert not (tmp_path / "log.sqlite").exists()


def test_the_prefix_cache_and_prefill_budget_flags_reach_the_engine(tmp_path):
  from fineflax.serve.__main__ import parse_args
  from fineflax.serve.build import build
  model = tiny_chat_model(tmp_path)
  for flags, cached, budget in (([], True, 2048), (["--no-prefix-cache", "--prefill-tokens", "512"], False, 512)):
    server, _ = build(parse_args(["--model", model, "--quant", "none", "--log", ":memory:", *flags]))
    engine = server.engine.driver.engine
    assert (engine.prefix_cache, engine.prefill_tokens, engine.interleave_prefill) == (cached, budget, True)
