"""serve.metrics: every metric has HELP and TYPE lines and one sample (a summary: its quantiles, count and sum),
NaN before any wait; /health's flat fields carry the same values."""
import math

import pytest

from fineflax.serve.metrics import METRICS, health_fields, prometheus
from fineflax.serve.waiting import QUANTILES

pytestmark = pytest.mark.fast


def _values(quantiles):
  values = {name: i for i, name in enumerate(METRICS)}
  values["queue_wait_seconds"] = {"quantiles": quantiles, "count": 3, "sum": 1.25}
  return values


def test_prometheus_text_has_every_metric_once_with_its_type():
  values = _values({q: 0.1 * (i + 1) for i, q in enumerate(QUANTILES)})
  lines = prometheus(values).splitlines()
  samples = dict(line.rsplit(" ", 1) for line in lines if not line.startswith("#"))
  for name, (kind, _) in METRICS.items():
    assert f"# TYPE fineflax_{name} {kind}" in lines
    if kind == "summary":
      assert [float(samples[f'fineflax_{name}{{quantile="{q:g}"}}']) for q in QUANTILES] == pytest.approx(
          [0.1, 0.2, 0.3])
      assert samples[f"fineflax_{name}_count"] == "3" and float(samples[f"fineflax_{name}_sum"]) == 1.25
    else:
      assert int(samples[f"fineflax_{name}"]) == values[name]
  assert all(n.endswith("_total") for n, (k, _) in METRICS.items() if k == "counter")


def test_nan_quantiles_before_any_wait():
  values = _values({q: float("nan") for q in QUANTILES})
  assert 'fineflax_queue_wait_seconds{quantile="0.5"} NaN' in prometheus(values)
  fields = health_fields(values)
  assert fields["queue_wait_p50_s"] is None and fields["pages_used"] == values["pages_used"]
  assert not any(isinstance(v, float) and math.isnan(v) for v in fields.values())
