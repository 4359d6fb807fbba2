"""launch.py: --dry_run report without loading weights; unknown keys and wrong types name the key."""
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _launch(*args):
  return subprocess.run([sys.executable, "launch.py", *args], cwd=ROOT, capture_output=True, text=True,
                        timeout=120)


def test_dry_run_reports_counts_and_memory():
  r = _launch("--config", "configs/quickstart.py", "--dry_run", "--config.lora.r=8")
  assert r.returncode == 0, r.stderr
  assert "parameters: 134,515,008" in r.stdout  # SmolLM2-135M, tied embeddings
  assert "trainable LoRA parameters (r=8):" in r.stdout
  assert "total_gib:" in r.stdout and "quant=nf4" in r.stdout
  assert "r: 8" in r.stdout  # the resolved config


def test_unknown_key_and_wrong_type_name_the_key():
  r = _launch("--config", "configs/quickstart.py", "--dry_run", "--config.lora.rank=8")
  assert r.returncode != 0 and "rank" in r.stderr
  r = _launch("--config", "configs/quickstart.py", "--dry_run", "--config.lora.r=eight")
  assert r.returncode != 0 and "lora.r" in r.stderr


def test_unknown_job_is_named(tmp_path):
  cfg = tmp_path / "bad.py"
  cfg.write_text("import ml_collections\n\ndef get_config():\n  c = ml_collections.ConfigDict()\n"
                 "  c.job = 'dance'\n  return c\n")
  r = _launch("--config", str(cfg), "--dry_run")
  assert r.returncode != 0 and "config.job='dance' is not a job" in r.stderr
