"""Writes the bundled sample datasets (original content, deterministic): python make_samples.py

  arithmetic_messages.jsonl        messages           "What is 17 + 25?" -> "17 + 25 = 42." (learnable fast)
  units_sharegpt.json              sharegpt           unit conversions, some multi-turn or with a system turn
  world_alpaca.jsonl               alpaca             facts about the fictional land of Varnholm
  strings_prompt_completion.csv    prompt_completion  reverse / uppercase / count letters of a word
  tools_glaive.jsonl               glaive             calls to made-up tools (tides, airships, crowns, stars)

`build_samples()` returns {file name: text}; tests compare it with the files on disk.
"""
from __future__ import annotations

import csv
import io
import json
import os
import pathlib
import random

SEED = 20240611


def arithmetic(rng: random.Random, n: int = 400, first: tuple[int, int] = (2, 60)) -> str:
  """Sums and differences; the eval set draws its first operand from 61..99 so no question repeats."""
  rows = []
  for _ in range(n):
    a, b = rng.randint(*first), rng.randint(2, 40)
    op = rng.choice("+-")
    a, b = (a, b) if op == "+" or a >= b else (b, a)
    c = a + b if op == "+" else a - b
    msgs = [{"role": "user", "content": f"What is {a} {op} {b}?"},
            {"role": "assistant", "content": f"{a} {op} {b} = {c}."}]
    if rng.random() < 0.15:  # a follow-up turn
      d = rng.randint(1, 9)
      msgs += [{"role": "user", "content": f"Now add {d}."},
               {"role": "assistant", "content": f"{c} + {d} = {c + d}."}]
    rows.append({"messages": msgs})
  return "".join(json.dumps(r) + "\n" for r in rows)


UNITS = [("km", "m", 1000), ("m", "cm", 100), ("kg", "g", 1000), ("h", "min", 60), ("min", "s", 60),
         ("L", "mL", 1000), ("cm", "mm", 10), ("d", "h", 24), ("wk", "d", 7), ("t", "kg", 1000)]


def units(rng: random.Random, n: int = 300) -> str:
  rows = []
  for _ in range(n):
    big, small, factor = rng.choice(UNITS)
    x = rng.randint(1, 30)
    conv = []
    if rng.random() < 0.25:
      conv.append({"from": "system", "value": "You convert units. Answer in one line."})
    conv += [{"from": "human", "value": f"Convert {x} {big} to {small}."},
             {"from": "gpt", "value": f"{x} {big} = {x * factor} {small}."}]
    if rng.random() < 0.3:
      y = rng.randint(1, 30)
      conv += [{"from": "human", "value": f"And {y * factor} {small} in {big}?"},
               {"from": "gpt", "value": f"{y * factor} {small} = {y} {big}."}]
    rows.append({"conversations": conv})
  return "[\n" + ",\n".join(json.dumps(r) for r in rows) + "\n]\n"


SYL = ["var", "nol", "esk", "dun", "mer", "tal", "bri", "ost", "kel", "ran", "sul", "vey", "hol", "mar"]
EXPORTS = ["amber", "salt", "wool", "copper", "glass", "honey", "timber", "silk", "ink", "tin"]


def _name(rng: random.Random, parts: int = 2) -> str:
  return "".join(rng.choice(SYL) for _ in range(parts)).capitalize()


def world(rng: random.Random, n: int = 300) -> str:
  provinces = {}
  while len(provinces) < 24:
    provinces[_name(rng)] = None
  facts = {p: {"capital": _name(rng, 3), "river": "the " + _name(rng), "founded": rng.randint(400, 1400),
               "export": rng.choice(EXPORTS)} for p in provinces}
  questions = [
      ("capital", "What is the capital of the province of {p}?", "The capital of {p} is {capital}."),
      ("river", "Which river flows through {p}?", "{river_cap} flows through {p}."),
      ("founded", "When was {p} founded?", "{p} was founded in the year {founded}."),
      ("export", "What is the chief export of {p}?", "The chief export of {p} is {export}."),
  ]
  rows = []
  for _ in range(n):
    p = rng.choice(list(facts))
    _, q, a = rng.choice(questions)
    f = dict(facts[p], p=p, river_cap=facts[p]["river"][0].upper() + facts[p]["river"][1:])
    if rng.random() < 0.5:
      row = {"instruction": "Answer the question about the land of Varnholm.", "input": q.format(**f),
             "output": a.format(**f)}
    else:
      row = {"instruction": q.format(**f) + " (Varnholm)", "input": "", "output": a.format(**f)}
    rows.append(row)
  return "".join(json.dumps(r) + "\n" for r in rows)


WORDS = ["planet", "lantern", "river", "copper", "meadow", "falcon", "harbor", "pebble", "garden", "window",
         "candle", "marble", "rocket", "violin", "button", "orange", "silver", "castle", "tunnel", "bridge",
         "dragon", "forest", "pencil", "anchor", "island", "summer", "winter", "basket", "ladder", "mirror"]


def strings(rng: random.Random, n: int = 300) -> str:
  out = io.StringIO()
  writer = csv.writer(out, lineterminator="\n")
  writer.writerow(["prompt", "completion"])
  tasks = [("Reverse the word: {w}", lambda w: w[::-1]), ("Uppercase the word: {w}", str.upper),
           ("How many letters are in the word {w}?", lambda w: f"{w} has {len(w)} letters."),
           ("What is the first letter of {w}?", lambda w: f"The first letter of {w} is {w[0]}.")]
  for _ in range(n):
    w = rng.choice(WORDS)
    prompt, answer = rng.choice(tasks)
    writer.writerow([prompt.format(w=w), answer(w)])
  return out.getvalue()


TOOLS = {
    "get_tide_level": ({"harbor": ("string", "Harbor name"), "hour": ("integer", "Hour of the day, 0-23")},
                       "Get the predicted tide level at a harbor"),
    "book_airship": ({"origin": ("string", "Departure city"), "destination": ("string", "Arrival city"),
                      "passengers": ("integer", "Number of passengers")}, "Book seats on an airship"),
    "convert_to_crowns": ({"amount": ("number", "Amount of money"), "currency": ("string", "Currency code")},
                          "Convert money into Varnholm crowns"),
    "lookup_star_chart": ({"constellation": ("string", "Constellation name")},
                          "Find when a constellation is visible"),
}


def _definition(name: str) -> str:
  params, desc = TOOLS[name]
  return json.dumps({"name": name, "description": desc, "parameters": {
      "type": "object", "properties": {k: {"type": t, "description": d} for k, (t, d) in params.items()},
      "required": list(params)}}, indent=4)


def _tool_turn(rng: random.Random, name: str):
  city = lambda: _name(rng, 3)
  if name == "get_tide_level":
    args = {"harbor": city(), "hour": rng.randint(0, 23)}
    level = round(rng.uniform(0.2, 4.8), 1)
    return (f"How high is the tide at {args['harbor']} harbor at {args['hour']}:00?", args,
            {"level_m": level},
            f"The tide at {args['harbor']} at {args['hour']}:00 is expected to be {level} m.")
  if name == "book_airship":
    args = {"origin": city(), "destination": city(), "passengers": rng.randint(1, 6)}
    code = "".join(rng.choice("ABCDEFGHJK") for _ in range(3)) + str(rng.randint(100, 999))
    return (f"Book an airship from {args['origin']} to {args['destination']} for {args['passengers']} "
            f"people.", args, {"status": "booked", "code": code},
            f"Done: {args['passengers']} seats from {args['origin']} to {args['destination']}, "
            f"booking code {code}.")
  if name == "convert_to_crowns":
    cur, rate = rng.choice([("USD", 3), ("EUR", 4), ("GBP", 5)])
    args = {"amount": rng.randint(2, 90), "currency": cur}
    return (f"How many crowns is {args['amount']} {cur}?", args, {"crowns": args["amount"] * rate},
            f"{args['amount']} {cur} is {args['amount'] * rate} crowns.")
  const = rng.choice(["the Lantern", "the Heron", "the Anvil", "the Twin Wheels"])
  month = rng.choice(["March", "June", "September", "December"])
  return (f"When can I see {const}?", {"constellation": const}, {"best_month": month},
          f"{const[0].upper() + const[1:]} is best seen in {month}.")


def tools(rng: random.Random, n: int = 200) -> str:
  rows = []
  for _ in range(n):
    names = rng.sample(sorted(TOOLS), 2 if rng.random() < 0.4 else 1)
    system = ("SYSTEM: You are a helpful assistant with access to the following functions. Use them if "
              "required -\n" + "\n\n".join(_definition(nm) for nm in names))
    if rng.random() < 0.15:
      w = rng.choice(WORDS)
      chat = (f"USER: Can you paint a picture of a {w}?\n\n\nASSISTANT: I'm sorry, I can't paint. I can only "
              f"use the tools I have: {', '.join(names)}. <|endoftext|>\n\n\n")
    else:
      question, args, result, answer = _tool_turn(rng, names[0])
      call = json.dumps({"name": names[0], "arguments": "@"}).replace('"@"', f"'{json.dumps(args)}'")
      chat = (f"USER: {question}\n\n\nASSISTANT: <functioncall> {call} <|endoftext|>\n\n\n"
              f"FUNCTION RESPONSE: {json.dumps(result)}\n\n\nASSISTANT: {answer} <|endoftext|>\n\n\n")
    rows.append({"system": system, "chat": chat})
  return "".join(json.dumps(r) + "\n" for r in rows)


def build_samples() -> dict[str, str]:
  rng = lambda k: random.Random(SEED + k)
  return {
      "arithmetic_messages.jsonl": arithmetic(rng(0)),
      "arithmetic_eval_messages.jsonl": arithmetic(rng(5), n=64, first=(61, 99)),
      "units_sharegpt.json": units(rng(1)),
      "world_alpaca.jsonl": world(rng(2)),
      "strings_prompt_completion.csv": strings(rng(3)),
      "tools_glaive.jsonl": tools(rng(4)),
  }


def main(out_dir: pathlib.Path = pathlib.Path(__file__).parent) -> None:
  for name, text in build_samples().items():
    tmp = out_dir / (name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, out_dir / name)
    print(f"{name}: {len(text.encode()):,} bytes")


if __name__ == "__main__":
  main()
