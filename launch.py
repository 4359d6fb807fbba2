r"""fineflax entry point.

  python launch.py --config configs/NAME.py[:preset,...] [--config.a.b=value ...] [--workdir DIR]
                   [--dry_run] [--verbose]

The config's `job` field picks the module `fineflax.jobs.<job>`, whose `run(config, workdir)` does the work.
The workdir defaults to runs/<config name>[-<presets>], so repeating a command resumes it. A user mistake
(bad config value, missing file, changed config over old checkpoints) prints one line and exits 2
(`--verbose` shows the traceback); a run stopped by SIGINT/SIGTERM exits 130/143 after saving.
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
_VERBOSE = flags.DEFINE_bool("verbose", False, "Show tracebacks of user errors and INFO logs.")


def default_workdir(spec: str) -> str:
  path, _, presets = spec.partition(":")
  name = os.path.splitext(os.path.basename(path))[0]
  return os.path.join("runs", name + (f"-{presets.replace(',', '-')}" if presets else ""))


def user_errors() -> tuple:
  """Exceptions that are the user's mistake (one line, exit 2), not a bug."""
  from fineflax.config_checks import ConfigError
  from fineflax.data.sources import DataError
  from fineflax.rl.traces import TraceFormatError
  from fineflax.train.checkpoint import CheckpointUnreadable
  from fineflax.train.run_config import ConfigChanged
  return (ConfigError, ConfigChanged, CheckpointUnreadable, DataError, TraceFormatError, FileNotFoundError)


def main(argv) -> int:
  from fineflax import jobs
  from fineflax.jobs.resolve import parse_config_flags, validate
  errors = user_errors()
  try:
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
      print(jobs.dry_run_report(config))
      return 0
    workdir = _WORKDIR.value or default_workdir(config_flags.get_config_filename(flags.FLAGS["config"]))
    print(f"workdir: {workdir}", flush=True)
    out = jobs.run(config, workdir)
  except errors as e:
    if "--verbose" in argv:
      raise
    print(f"error: {e}", file=sys.stderr)
    return 2
  return int(out.get("exit_code", 0)) if isinstance(out, dict) else 0


if __name__ == "__main__":
  sys.exit(main(sys.argv))
