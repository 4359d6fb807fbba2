"""fineflax.io: invalid JSON names the file; a failed atomic write leaves the old file and no debris."""
import os

import pytest

from fineflax import io as ffio


def test_read_json_names_the_file(tmp_path):
  p = tmp_path / "config.json"
  p.write_text('{"a": 1,}')
  with pytest.raises(ValueError, match=r"config.json: invalid JSON \(.*line 1"):
    ffio.read_json(p)
  p.write_text('{"a": [1, 2]}')
  assert ffio.read_json(p) == {"a": [1, 2]}


def test_failed_atomic_write_keeps_the_old_file(tmp_path, monkeypatch):
  p = tmp_path / "history.json"
  ffio.atomic_write_text(p, "old")
  def boom(*a, **k):
    raise OSError(28, "No space left on device")
  monkeypatch.setattr(os, "replace", boom)
  with pytest.raises(OSError):
    ffio.atomic_write_text(p, "new")
  assert p.read_text() == "old" and sorted(os.listdir(tmp_path)) == ["history.json"]
