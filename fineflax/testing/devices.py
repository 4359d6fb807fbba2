"""Scripts run on forced CPU devices: XLA_FLAGS must name the device count before jax is imported, so a
test that needs a mesh runs its script in a subprocess with `cpu_devices_env(n)`, from the repository root."""
import os
import pathlib
import subprocess
import sys

ROOT = str(pathlib.Path(__file__).resolve().parents[2])


def cpu_devices_env(devices: int) -> dict:
  """os.environ with `devices` forced host devices and the CPU platform."""
  return dict(os.environ, XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}", JAX_PLATFORMS="cpu")


def run_script(script: str, *args: str, devices: int, timeout: float) -> subprocess.CompletedProcess:
  """`python -c script *args` in ROOT on `devices` CPU devices; stdout and stderr captured as text."""
  return subprocess.run([sys.executable, "-c", script, *args], cwd=ROOT, env=cpu_devices_env(devices),
                        capture_output=True, text=True, timeout=timeout)
