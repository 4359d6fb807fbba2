"""The Markdown tables of `benchmarks/engine.py`, one per case, from a worker's result dict (and case b's
old-sampler baseline)."""
from __future__ import annotations

from benchmarks._results import markdown_table


def table_a(res: dict) -> str:
  head = (f"Device: {res.get('device')}. BW {res.get('bw', 0) / 1e12:.2f} TB/s; weights "
          f"{res.get('weight_bytes', 0) / 1e9:.2f} GB; read ms/step (weights + mean live KV) "
          f"{res.get('read_ms', 0):.2f}.\n\n")
  rows, by = [], {}
  for r in res.get("rows", []):
    if "error" in r:
      rows.append([r["attention"], r["room"], "error", "-", "-", "-", "-", r["error"][:120]])
      continue
    by[(r["attention"], r["room"])] = r["ms_step"]
    rows.append([r["attention"], r["room"], r["ms_step"], r["ms_step"] / res["read_ms"], r["pool_gib"],
                 r["programs"], r["compile_s"], ""])
  notes = []
  for att in {a for a, _ in by}:
    rooms = sorted(room for a, room in by if a == att)
    if len(rooms) == 2:
      ratio = by[(att, rooms[1])] / by[(att, rooms[0])]
      notes.append(f"- {att}: room {rooms[1]} / room {rooms[0]} = {ratio:.3f} (target <= 1.1: "
                   f"{'met' if ratio <= 1.1 else 'missed'})")
  need = min((room for _, room in by), default=None)
  for att in sorted({a for a, _ in by} - {"static"}):
    if (att, need) in by and ("static", need) in by:
      ratio = by[(att, need)] / by[("static", need)]
      notes.append(f"- {att} / static at room {need} = {ratio:.3f} (target <= 1.0: {'met' if ratio <= 1 else 'missed'})")
  return head + markdown_table(["attention", "room", "ms/step", "/ read", "pool GiB", "programs", "compile s",
                                "note"], rows) + "\n\n" + "\n".join(notes)


def table_b(res: dict, base: dict | None) -> str:
  head = (f"Device: {res.get('device')}. BW {res.get('bw', 0) / 1e12:.2f} TB/s; read bound "
          f"{res.get('bound_s', 0):.2f} s over {max(res.get('lengths') or [0])} steps; lengths: median "
          f"{sorted(res.get('lengths') or [0])[len(res.get('lengths') or [0]) // 2]}, max "
          f"{max(res.get('lengths') or [0])}, total {sum(res.get('lengths') or [0])} tokens.\n\n")
  rows = []
  old = None
  if base and "walls" in base:
    if len(base["walls"]) > 1:  # the last of several runs (the first compiled)
      old, how = base["walls"][-1], f"run {len(base['walls'])} of {len(base['walls'])} (first {base['walls'][0]:.1f} s)"
    else:
      old = base["walls"][0] - base["compiles"][0]
      how = f"one run: wall {base['walls'][0]:.1f} s - logged compile {base['compiles'][0]:.1f} s"
    rows.append(["old static sampler", old, old / res["bound_s"], "-",
                 f"{how}; {base['steps']} steps; peak {base['peak_gib']:.1f} GiB; {base['fineflax']}"])
  elif base:
    rows.append(["old static sampler", "error", "-", "-", str(base.get("error"))[:200]])
  first = {}  # attention -> tokens/s of its first (admission, pool) row
  for r in res.get("rows", []):
    name = f"engine ({r['attention']}, {r.get('admission', 'reserve')})"
    if "error" in r:
      rows.append([name] + ["error"] + ["-"] * 6 + [r["error"][:200]])
      continue
    base = first.setdefault(r["attention"], r["tokens_s"])
    rows.append([name, r["wall_s"], r["wall_s"] / res["bound_s"], f"{old / r['wall_s']:.2f}x" if old else "-",
                 f"{r['tokens_s']:.0f}", f"{r['tokens_s'] / base:.3f}", f"{r['peak_rows']} / {r['mean_rows']:.1f}",
                 f"{r['preemptions']} / {r['recomputed_tokens']}",
                 f"pool {r['pool_pages']} pages, peak {r['peak_pages']}; first run {r['first_s']:.1f} s; "
                 f"{r['programs']} programs; peak {r['peak_gib']:.1f} GiB{_dispatch_note(r)}"])
  return head + markdown_table(["sampler", "wall s", "/ read bound", "speed-up vs old", "tokens/s",
                                "tokens/s / first row (target >= 0.95)", "rows in flight peak / mean",
                                "preemptions / recomputed tokens", "note"], rows)


CHUNK_STATS = ("dispatch_s", "wait_s", "gap_s", "decode_calls", "gaps")  # the `Engine.stats` chunk_ms reads


def chunk_ms(delta: dict) -> dict:
  """ms a decode chunk, from `Engine.stats` counts over a run (`CHUNK_STATS`): in the decode call, awaiting its
  results (both per call), and on the host before it (per gap)."""
  calls = max(delta["decode_calls"], 1)
  return {"dispatch_ms_chunk": 1e3 * delta["dispatch_s"] / calls, "wait_ms_chunk": 1e3 * delta["wait_s"] / calls,
          "gap_ms_chunk": 1e3 * delta["gap_s"] / max(delta["gaps"], 1)}


def chunk_ms_cell(ms: dict) -> str:
  """'call / wait / gap' ms of a `chunk_ms` row."""
  return f"{ms['dispatch_ms_chunk']:.2f} / {ms['wait_ms_chunk']:.2f} / {ms['gap_ms_chunk']:.2f}"


THREADS = {"engine": "fineflax-engine", "emit": "fineflax-emit", "loop": "MainThread"}  # the server's, by name


def thread_cpu_ms(threads: dict, total: float, chunks: int) -> dict:
  """CPU ms a decode chunk of the server's engine, emitter and event-loop (main) threads, from {thread name: CPU
  seconds over a level}, and of the rest of its processes (`total` less those: XLA's, the log writer's, workers',
  the links'). With front-end processes (/health names "engine:thread", "api0:thread", ...) "loop" sums the front
  ends' main threads; the engine process's main thread only waits for them (it counts as "other")."""
  ms, seen = dict.fromkeys(THREADS, 0.0), set()
  for name, seconds in threads.items():
    prefix, _, bare = name.rpartition(":")
    kind = next((k for k, n in THREADS.items() if bare == n and not (k == "loop" and prefix == "engine")), None)
    if kind is not None:
      ms[kind] += 1e3 * seconds / chunks
      seen.add(kind)
  ms = {k: v if k in seen else float("nan") for k, v in ms.items()}
  return {**ms, "other": 1e3 * total / chunks - sum(v for k, v in ms.items() if k in seen)}


def _dispatch_note(r: dict) -> str:
  """'; decode call / wait / host gap ms a chunk: x / y / z' (`chunk_ms`; absent in older results)."""
  return f"; decode call / wait / host gap ms a chunk: {chunk_ms_cell(chunk_ms(r))}" if "dispatch_s" in r else ""


def table_c(res: dict) -> str:
  rows = [[r["mode"], r["prefill_tokens"], r["prompt_pages"], r["copied_pages"], r["prefill_s"]]
          for r in res.get("rows", [])]
  by = {r["mode"]: r for r in res.get("rows", [])}
  note = ""
  if len(by) == 2:
    ratio = lambda k: by["shared"][k] / by["unshared"][k]
    note = (f"\n\nshared / unshared: prefill tokens {ratio('prefill_tokens'):.3f}, "
            f"prompt pages {ratio('prompt_pages'):.3f}, prefill time {ratio('prefill_s'):.3f}")
  return (f"Device: {res.get('device')}.\n\n" + markdown_table(
      ["prompts", "tokens prefilled", "pages holding prompt positions", "pages copied on write", "prefill s"],
      rows) + note)


def table_tp(res: dict) -> str:
  head = (f"Device: {res.get('device')} x {res.get('devices')} (model axis), decoder {res.get('impl')}, "
          f"linears {res.get('quant')}. BW "
          f"{res.get('bw', 0) / 1e12:.2f} TB/s; weights {res.get('weight_bytes', 0) / 1e9:.1f} GB, "
          f"{res.get('device_weight_bytes', 0) / 1e9:.1f} GB a device; weight-read ms/step a device "
          f"{res.get('read_ms', 0):.2f} (with the mean live KV {res.get('read_kv_ms', 0):.2f}); random weights "
          f"made in {res.get('init_s', 0):.0f} s.\n\n")
  rows = []
  for r in res.get("rows", []):
    what = r["attention"] + (f", NF4 {r['nf4_kernel']}" if r.get("nf4_kernel") else "")
    if "error" in r:
      rows.append([what, "error", "-", "-", "-", "-", r["error"][:160]])
      continue
    ratio = r["ms_step"] / res["read_ms"]
    rows.append([what, r["ms_step"], f"{ratio:.2f} ({'met' if ratio <= 3 else 'missed'})",
                 " / ".join(f"{p:.1f}" for p in r["peak_gib"]), r["pool_gib_device"], r["compile_s"],
                 f"{r['steps']} steps; {r['programs']} programs"])
  return head + markdown_table(["attention, NF4 products (FINEFLAX_NF4_KERNEL)", "ms/step",
                                "/ weight read a device (target <= 3)", "peak GiB per device", "pool GiB a device",
                                "compile s", "note"], rows)
