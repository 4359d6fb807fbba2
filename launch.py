r"""fineflax entry point.

  python launch.py --config configs/NAME.py [--config.a.b=value ...] [--workdir DIR] [--dry_run]

The config's `job` field picks the module `fineflax.jobs.<job>`, whose `run(config, workdir)` does the work.
"""
from absl import app, flags, logging
from ml_collections import config_flags

from fineflax import jobs

_CONFIG = config_flags.DEFINE_config_file("config", None, "Path to a get_config() file.", lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Where checkpoints, logs and exports go.")
_DRY_RUN = flags.DEFINE_bool("dry_run", False, "Print the resolved config, parameter counts and a memory "
                             "estimate, then exit without loading weights.")
flags.mark_flags_as_required(["config"])


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  logging.set_verbosity(logging.WARNING)  # orbax and jax log every save at INFO
  config = _CONFIG.value
  if _DRY_RUN.value:
    print(jobs.dry_run_report(config))
    return
  jobs.run(config, _WORKDIR.value)


if __name__ == "__main__":
  app.run(main)
