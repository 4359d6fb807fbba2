"""python -m fineflax.inspect_data --config configs/quickstart.py [--source S] [--n 3] [--json] [--max_rows 2000]
[--config.data.max_length=128 ...]: the command line of `fineflax.data.inspect` (what an SFT config trains on,
without loading model weights). The config flags are parsed as launch.py parses them
(`fineflax.jobs.resolve.parse_config_flags`) and a user error prints one line and exits 2
(`fineflax.cli.run_cli`).
"""
from __future__ import annotations

import json
import sys

from fineflax.cli import run_cli
from fineflax.config_checks import ConfigError
from fineflax.data.inspect import format_report, inspect_config
from fineflax.jobs.resolve import parse_config_flags


def main(argv) -> int:
  """The report of --config's data; a user mistake raises an error that `fineflax.cli.run_cli` prints as
  one line (exit 2), as launch.py does."""
  from absl import flags, logging
  FLAGS = flags.FLAGS
  rest = parse_config_flags(FLAGS, argv)
  if len(rest) > 1:
    raise ConfigError(f"unexpected arguments: {rest[1:]}")
  if FLAGS.config is None:
    raise ConfigError("--config is required, e.g. --config configs/quickstart.py")
  logging.set_verbosity(logging.WARNING)  # datasets/jax announce themselves at INFO
  report = inspect_config(FLAGS.config, source=FLAGS.source, n=FLAGS.n, max_rows=FLAGS.max_rows)
  if FLAGS.json:
    print(json.dumps(report, indent=1))
  else:
    print(format_report(report, color=sys.stdout.isatty()))
  return 0


def _define_flags():
  from absl import flags
  from ml_collections import config_flags
  config_flags.DEFINE_config_file("config", None, "Path to a get_config() file.", lock_config=True)
  flags.DEFINE_string("source", None, "Only sources whose name contains this.")
  flags.DEFINE_integer("n", 3, "Rows shown per source.")
  flags.DEFINE_integer("max_rows", 2000, "Rows scanned per source for the statistics (0 = all).")
  flags.DEFINE_bool("json", False, "Print one JSON object instead of text.")
  flags.DEFINE_bool("verbose", False, "Show tracebacks of user errors.")


if __name__ == "__main__":
  _define_flags()
  sys.exit(run_cli(main, sys.argv))
