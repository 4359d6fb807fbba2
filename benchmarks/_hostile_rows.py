"""A hostile probe's result: one table row {area, probe, expected, seen, ok} (benchmarks/hostile.py and the
probe modules it runs)."""
from __future__ import annotations


def row(area: str, probe: str, expected: str, seen: str, ok: bool) -> dict:
  return {"area": area, "probe": probe, "expected": expected, "seen": " ".join(str(seen).split())[:240],
          "ok": bool(ok)}


def guarded(area: str, probe: str, expected: str, fn) -> dict:
  """fn() -> (seen, ok); an exception is a failed probe that says what was raised."""
  try:
    seen, ok = fn()
  except Exception as e:  # noqa: BLE001 - reported in the table
    seen, ok = f"{type(e).__name__}: {e}", False
  return row(area, probe, expected, seen, ok)
