"""The server's counters and gauges, for `/health` (JSON) and `/metrics` (Prometheus text format 0.0.4).

    values = snapshot(engine)       # {name: value}, every name below
    text = prometheus(values)       # "# HELP ...\n# TYPE ...\nfineflax_pages_used 12\n..."

Pages (the KV pool of the running core engine; the trash page not counted): total, used (held by a live
sequence or the prefix cache; a shared page once), cached (held by the prefix cache), free (on the free list),
available (free + cached pages no sequence holds, which admission may evict). After a burst has finished,
used == cached: every page a request took is back (free, or kept by the prefix cache and evictable).
Rows: live (prefilling or decoding), waiting (rows of the requests not yet admitted). Counters since the
start: evictions (cached pages evicted), cancelled rows, queue rejections (full, expired), admitted requests,
generated tokens, decode chunks. Queue wait (s, from submit to a first row admitted) over the last
`waiting.WINDOW` requests: quantiles 0.5, 0.9, 0.99 (NaN before any), with count and sum since the start.
"""
from __future__ import annotations

import math

from fineflax.serve.waiting import QUANTILES

# name -> (Prometheus type, help); names are prefixed with "fineflax_" in the text format
METRICS = {
    "pages_total": ("gauge", "KV pages in the pool (the trash page not counted)"),
    "pages_used": ("gauge", "KV pages held by a live sequence or the prefix cache"),
    "pages_cached": ("gauge", "KV pages held by the prefix cache"),
    "pages_free": ("gauge", "KV pages on the free list"),
    "pages_available": ("gauge", "KV pages admission may hand out: free plus evictable cached pages"),
    "rows_live": ("gauge", "sequences prefilling or decoding"),
    "rows_waiting": ("gauge", "rows of the requests waiting for a decode slot"),
    "evictions_total": ("counter", "cached KV pages evicted"),
    "cancelled_rows_total": ("counter", "rows cancelled (client gone, queue deadline, failure)"),
    "rejected_queue_full_total": ("counter", "requests refused with 429: the waiting queue was full"),
    "rejected_queue_timeout_total": ("counter", "requests refused with 503: their queue deadline passed"),
    "admitted_requests_total": ("counter", "requests with a row admitted to the engine"),
    "generated_tokens_total": ("counter", "completion tokens generated"),
    "decode_calls_total": ("counter", "decode chunks run on the device"),
    "queue_wait_seconds": ("summary", "seconds from submit to the first row admitted"),
}


def snapshot(engine) -> dict:
  """{name: value} of the server engine `engine` (`serve.engine.Engine`) now; queue_wait_seconds is
  {"quantiles": {q: s}, "count": n, "sum": s}."""
  core, stats, waiting = engine.driver.engine, engine.stats, engine.waiting
  pages = core.pages
  total = pages.num_pages - 1
  return {"pages_total": total, "pages_used": pages.num_used, "pages_cached": pages.num_cached,
          "pages_free": total - pages.num_used, "pages_available": pages.num_free,
          "rows_live": len(core.live), "rows_waiting": waiting.rows, "evictions_total": stats["evictions"],
          "cancelled_rows_total": stats["cancelled_rows"], "rejected_queue_full_total": waiting.stats["rejected_full"],
          "rejected_queue_timeout_total": waiting.stats["expired"],
          "admitted_requests_total": waiting.stats["admitted"], "generated_tokens_total": stats["generated_tokens"],
          "decode_calls_total": stats["decode_calls"],
          "queue_wait_seconds": {"quantiles": waiting.wait_quantiles(), "count": waiting.stats["admitted"],
                                 "sum": waiting.stats["wait_s_sum"]}}


def health_fields(values: dict) -> dict:
  """The snapshot as /health's flat JSON fields (quantiles as queue_wait_p50_s, ...; NaN as null)."""
  out = {k: v for k, v in values.items() if k != "queue_wait_seconds"}
  for q, v in values["queue_wait_seconds"]["quantiles"].items():
    out[f"queue_wait_p{round(100 * q)}_s"] = None if math.isnan(v) else round(v, 6)
  return out


def _number(v) -> str:
  return "NaN" if isinstance(v, float) and math.isnan(v) else repr(float(v)) if isinstance(v, float) else str(v)


def prometheus(values: dict) -> str:
  """The Prometheus text exposition of a `snapshot`."""
  lines = []
  for name, (kind, help_) in METRICS.items():
    full = f"fineflax_{name}"
    lines += [f"# HELP {full} {help_}", f"# TYPE {full} {kind}"]
    v = values[name]
    if kind == "summary":
      lines += [f'{full}{{quantile="{q:g}"}} {_number(v["quantiles"][q])}' for q in QUANTILES]
      lines += [f"{full}_count {v['count']}", f"{full}_sum {_number(float(v['sum']))}"]
    else:
      lines.append(f"{full} {_number(v)}")
  return "\n".join(lines) + "\n"
