r"""fineflax entry point.

  python launch.py --config configs/NAME.py[:preset,...] [--config.a.b=value ...] [--workdir DIR]
                   [--dry_run [--devices N] [--device_memory_gb GB]] [--verbose]
  python launch.py --help | --helpfull | --config configs/NAME.py[:preset,...] --help

The config's `job` field picks the module `fineflax.jobs.<job>`, whose `run(config, workdir)` does the work.
The workdir defaults to runs/<config name>[-<presets>], so repeating a command resumes it. A user mistake
(a bad config value or file, a missing optional package, a workdir that is a file, a bad data file, a
changed config over old checkpoints, a memory plan that cannot fit the devices: `fineflax.jobs.memory_plan`)
prints one line and exits 2 before any weight is loaded
(`fineflax.cli`; `--verbose` shows the traceback); a run stopped by SIGINT/SIGTERM exits 130/143 after saving,
and SIGINT before the training loop (e.g. while the model loads) prints one line and exits 130.
"""
import os
import sys

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")  # transformers is only used for tokenizers here

from absl import flags, logging  # noqa: E402
from ml_collections import config_flags  # noqa: E402

_CONFIG = config_flags.DEFINE_config_file("config", None, "Path to a get_config() file[:presets].",
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Where checkpoints, logs and exports go "
                               "(default runs/<config name>[-<presets>]).")
_DRY_RUN = flags.DEFINE_bool("dry_run", False, "Print the resolved config, parameter counts and a memory "
                             "estimate, then exit without loading weights.")
_DEVICES = flags.DEFINE_integer("devices", None, "--dry_run: plan for this many devices instead of the "
                                 "visible ones (e.g. 8 with --device_memory_gb=80 on a CPU).")
_DEVICE_MEMORY_GB = flags.DEFINE_float("device_memory_gb", None, "Memory per device (GiB) the plan must fit: "
                                       "default the device's own limit (unknown on CPU: no fit check).")
_VERBOSE = flags.DEFINE_bool("verbose", False, "Show tracebacks of user errors and INFO logs.")


def default_workdir(spec: str) -> str:
  path, _, presets = spec.partition(":")
  name = os.path.splitext(os.path.basename(path))[0]
  return os.path.join("runs", name + (f"-{presets.replace(',', '-')}" if presets else ""))


def main(argv) -> int:
  from fineflax.jobs.help import help_text, wants_help
  if wants_help(argv):  # before the flags are parsed: --help lists them, the configs and their presets
    print(help_text(argv, flags.FLAGS, __doc__), end="")
    return 0
  from fineflax import jobs
  from fineflax.jobs.resolve import parse_config_flags, validate
  from fineflax.train.run_config import check_workdir
  rest = parse_config_flags(flags.FLAGS, argv)
  if len(rest) > 1:
    raise jobs.ConfigError(f"unexpected arguments: {rest[1:]}")
  if _CONFIG.value is None:
    raise jobs.ConfigError("--config is required, e.g. --config configs/quickstart.py")
  config = _CONFIG.value
  validate(config)
  from fineflax.train import distributed
  distributed.initialize(config.get("distributed"))  # before anything touches a device
  logging.set_verbosity(logging.INFO if _VERBOSE.value else logging.WARNING)
  if _DRY_RUN.value:
    try:
      print(jobs.dry_run_report(config, _DEVICES.value, _DEVICE_MEMORY_GB.value))
    except jobs.PlanRefused as e:
      print(e.report, flush=True)
      raise
    return 0
  if _DEVICES.value:
    raise jobs.ConfigError(f"--devices={_DEVICES.value} plans for other devices: use it with --dry_run")
  workdir = None
  if getattr(jobs.get_job(config.job), "USES_WORKDIR", True):  # the chat job writes nothing
    workdir = _WORKDIR.value or default_workdir(config_flags.get_config_filename(flags.FLAGS["config"]))
    check_workdir(workdir)
    print(f"workdir: {workdir}", flush=True)
  out = jobs.run(config, workdir, _DEVICE_MEMORY_GB.value)
  return int(out.get("exit_code", 0)) if isinstance(out, dict) else 0


if __name__ == "__main__":
  from fineflax.cli import run_cli
  sys.exit(run_cli(main, sys.argv))
