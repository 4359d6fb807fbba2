"""launch.py's help: `--help` / `-h` lists its flags and every config with its presets; `--helpfull` adds the
flags of the libraries it loads (absl); `--config X[:presets] --help` shows that config: its docstring, presets
and every field with its value (each one a `--config.KEY=VALUE` override). Nothing is loaded but the config
files (no model, no device).
"""
from __future__ import annotations

import importlib.util
import pathlib
import sys
from typing import Sequence

from fineflax.jobs.resolve import CHECKOUT, config_spec, load_config, resolve_config_file

HELP_FLAGS = ("--help", "-h", "--helpfull", "--helpshort", "-?")
LAUNCH_FLAGS = ("config", "workdir", "dry_run", "devices", "device_memory_gb", "verbose")


def wants_help(argv: Sequence[str]) -> bool:
  return any(a in HELP_FLAGS for a in argv[1:])


def config_files(root: pathlib.Path = CHECKOUT / "configs") -> list[pathlib.Path]:
  """The config files under `root` (those defining get_config), sorted, papers/ after the top level."""
  files = sorted(root.glob("*.py")) + sorted(root.glob("*/*.py"))
  return [f for f in files if "def get_config" in f.read_text(encoding="utf-8")]


def config_module(path: pathlib.Path):
  """The module of a config file, imported as ml_collections does (this checkout first on sys.path)."""
  if str(CHECKOUT) not in sys.path:
    sys.path.insert(0, str(CHECKOUT))
  spec = importlib.util.spec_from_file_location(f"_help_{path.stem}", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def _first_line(doc: str | None) -> str:
  return (doc or "").strip().splitlines()[0] if (doc or "").strip() else ""


def configs_section() -> list[str]:
  """One line a config: its path relative to the checkout, its presets and its docstring's first line."""
  lines = ["configs (python launch.py --config PATH[:PRESET,...]; presets apply in order):"]
  for path in config_files():
    module = config_module(path)
    presets = list(getattr(module, "PRESETS", {}))
    lines.append(f"  {path.relative_to(CHECKOUT)}" + (f"  presets: {', '.join(presets)}" if presets else "")
                 + f"\n      {_first_line(module.__doc__)}")
  return lines


def flags_section(flag_values) -> list[str]:
  lines = ["flags:"]
  for name in LAUNCH_FLAGS:
    f = flag_values[name]
    default = "" if f.default is None or name == "config" else f" (default {f.default})"
    lines.append(f"  --{name}: {f.help}{default}")
  lines.append("  --config.KEY=VALUE: override a field of the config (KEY as listed by --config X --help)")
  lines.append("  --help, -h: this help; --helpfull: also the flags of the libraries (absl)")
  return lines


def fields_of(config, prefix: str = "config.") -> dict:
  """{"config.a.b": value} of a ConfigDict, tuples kept (an override of a tuple field is written as one)."""
  out = {}
  for key, value in config.items():
    if hasattr(value, "items"):
      out.update(fields_of(value, f"{prefix}{key}."))
    else:
      out[f"{prefix}{key}"] = value
  return out


def config_help(spec: str) -> list[str]:
  """The docstring, presets and fields (`config.KEY = VALUE`) of the config `spec`."""
  path = pathlib.Path(resolve_config_file(spec).partition(":")[0])
  module = config_module(path)
  presets = list(getattr(module, "PRESETS", {}))
  fields = fields_of(load_config(spec))
  lines = [f"{spec}:", *["  " + ln for ln in (module.__doc__ or "").strip().splitlines()], "",
           f"presets: {', '.join(presets) if presets else '(none)'}", "",
           f"fields ({len(fields)}; override with --{next(iter(sorted(fields)), 'config.KEY')}=VALUE and so on):"]
  return lines + [f"  {key} = {value!r}" for key, value in sorted(fields.items())]


def help_text(argv: Sequence[str], flag_values, usage: str) -> str:
  """The text for launch.py `argv` holding a help flag (module doc). ConfigError for a bad --config."""
  spec = config_spec(argv)
  if spec:
    return "\n".join(config_help(spec)) + "\n"
  parts = [usage.strip(), "", *flags_section(flag_values), "", *configs_section()]
  if "--helpfull" in argv:
    parts += ["", "all flags:", flag_values.get_help()]
  return "\n".join(parts) + "\n"
