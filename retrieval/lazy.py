"""Deferred imports of optional heavy dependencies."""
from __future__ import annotations

import importlib.util
import sys
import types


def lazy_import(name: str, package: str | None = None) -> types.ModuleType:
  """`name` as a module whose code runs on first attribute access (importlib.util.LazyLoader).

  A missing module raises ImportError naming the pip package on first use, not at import time.
  """
  if name in sys.modules:
    return sys.modules[name]
  spec = importlib.util.find_spec(name)
  if spec is None:
    return _Missing(name, package or name)
  loader = importlib.util.LazyLoader(spec.loader)
  spec.loader = loader
  module = importlib.util.module_from_spec(spec)
  sys.modules[name] = module
  loader.exec_module(module)
  return module


class _Missing(types.ModuleType):
  def __init__(self, name: str, package: str):
    super().__init__(name)
    self._package = package

  def __getattr__(self, attr):
    raise ImportError(f"{self.__name__} is not installed: pip install {self._package}")
