"""Writes the bundled sample datasets (original content, deterministic): python make_samples.py

  arithmetic_messages.jsonl        messages           "What is 17 + 25?" -> "17 + 25 = 42." (learnable fast)
  units_sharegpt.json              sharegpt           unit conversions, some multi-turn or with a system turn
  world_alpaca.jsonl               alpaca             facts about the fictional land of Varnholm
  strings_prompt_completion.csv    prompt_completion  reverse / uppercase / count letters of a word
  tools_glaive.jsonl               glaive             calls to made-up tools (tides, airships, crowns, stars)

RL prompts and benchmarks, a few rows each in the public formats the papers' code reads (original problems,
questions and passages; only the column layout is imitated):

  luffy_openr1.parquet     LUFFY's training file data/openr1.parquet: data_source, prompt (system + user
                           messages), target (the off-policy trace as an assistant message), ability,
                           reward_model {ground_truth, style}, extra_info {index, split}
  luffy_valid.parquet      LUFFY's evaluation file data/valid.parquet: the same columns without target,
                           data_source one of aime, amc, math, minerva, olympiad_bench
  search_r1_train.parquet  Search-R1's nq_hotpotqa_train/train.parquet (scripts/data_process/qa_search_train_merge.py):
  search_r1_test.parquet   id, question, golden_answers, data_source (nq / hotpotqa), prompt (their "base"
                           template), ability, reward_model {ground_truth: {target: [...]}, style}, extra_info
  wiki_corpus.jsonl        Search-R1's retrieval corpus wiki-18.jsonl: {"id", "contents": "\"Title\"\ntext"}
                           per line (the passages answer the Search-R1 sample questions)
  gsm8k_test.jsonl         GSM8K (openai/gsm8k main): question, answer ("... <<a*b=c>>c ... #### c")
  math_test.jsonl          MATH (Hendrycks et al.): problem, level, type, solution (with \\boxed{answer})

`build_samples()` returns {file name: text} (SFT samples), `build_rl_samples()` {file name: text, or rows for
a parquet file}; tests compare both with the files on disk.
"""
from __future__ import annotations

import csv
import io
import json
import pathlib
import random

from fineflax.io import atomic_path

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


RL_SYSTEM = "Think step by step inside <think> </think>, then give the final answer in \\boxed{}."
# (question, ground truth, worked trace body, final answer text): original problems with verified answers
MATH_TRAIN = [
    ("What is the sum of the first 10 positive odd integers?", "100",
     "The first n odd integers sum to n^2, so the sum is 10^2 = 100.", "100"),
    ("Solve for $x$: $3x + 7 = 22$.", "5", "Subtract 7: 3x = 15. Divide by 3: x = 5.", "5"),
    ("What is $\\frac{2}{3} + \\frac{1}{6}$?", "\\frac{5}{6}",
     "Write 2/3 as 4/6; then 4/6 + 1/6 = 5/6.", "\\frac{5}{6}"),
    ("How many positive divisors does 36 have?", "9",
     "36 = 2^2 * 3^2, so it has (2+1)(2+1) = 9 divisors.", "9"),
    ("Find the remainder when $2^{10}$ is divided by 7.", "2",
     "2^3 = 8 = 1 mod 7, so 2^9 = 1 and 2^10 = 2 mod 7.", "2"),
    ("A rectangle has perimeter 30 and length 9. What is its area?", "54",
     "Length + width = 15, so the width is 6 and the area is 9 * 6 = 54.", "54"),
    ("Compute $\\binom{6}{2}$.", "15", "6 * 5 / 2 = 15.", "15"),
    ("What is the least common multiple of 8 and 12?", "24",
     "8 = 2^3 and 12 = 2^2 * 3, so the lcm is 2^3 * 3 = 24.", "24"),
]
# (data_source as in LUFFY's valid.parquet, problem, ground truth)
MATH_EVAL = [
    ("aime", "Find the number of ordered pairs of positive integers $(a, b)$ with $a + b = 20$.", "19"),
    ("aime", "What is the largest three-digit multiple of 13?", "988"),
    ("amc", "What is $1 + 2 + 3 + \\cdots + 20$?", "210"),
    ("amc", "A cube has surface area 54. What is its volume?", "27"),
    ("math", "Simplify $\\sqrt{50}$.", "5\\sqrt{2}"),
    ("math", "Solve $x^2 - 5x + 6 = 0$ and give the larger root.", "3"),
    ("minerva", "A car travels 150 km in 2.5 hours. What is its average speed in km/h?", "60"),
    ("minerva", "What is $\\log_{10} 1000$?", "3"),
    ("olympiad_bench", "Find all real $x$ with $|x - 1| < 2$. Give the answer as an interval.", "(-1,3)"),
    ("olympiad_bench", "What is the smallest prime greater than 50?", "53"),
]
SEARCH_R1_TEMPLATE = (  # Search-R1 scripts/data_process/nq_search.py, template_type "base"
    "Answer the given question. You must conduct reasoning inside <think> and </think> first every time you get "
    "new information. After reasoning, if you find you lack some knowledge, you can call a search engine by "
    "<search> query </search> and it will return the top searched results between <information> and "
    "</information>. You can search as many times as your want. If you find no further external knowledge "
    "needed, you can directly provide the answer inside <answer> and </answer>, without detailed "
    "illustrations. For example, <answer> Beijing </answer>. Question: {question}\n")
# (title, text): a fictional encyclopedia; the QA samples below are answered by these passages
PASSAGES = [
    ("Varnholm", "Varnholm is a coastal kingdom whose capital is Ostmar. Its currency is the crown."),
    ("Ostmar", "Ostmar is the capital of Varnholm. It lies at the mouth of the river Dunel."),
    ("Dunel", "The Dunel is a river that rises in the Kelran hills and reaches the sea at Ostmar."),
    ("Kelran hills", "The Kelran hills are a range in the north of Varnholm, known for copper mines."),
    ("Ines Marlow", "Ines Marlow is a Varnholm composer who wrote the opera The Salt Harbor in 1891."),
    ("The Salt Harbor", "The Salt Harbor is an opera by Ines Marlow, first staged at the Ostmar Royal Theatre."),
    ("Ostmar Royal Theatre", "The Ostmar Royal Theatre opened in 1862 and seats 1,400 people."),
    ("Tomas Brell", "Tomas Brell was an engineer who designed the Dunel Bridge, completed in 1907."),
    ("Dunel Bridge", "The Dunel Bridge crosses the river Dunel in Ostmar; it was designed by Tomas Brell."),
    ("Lena Sul", "Lena Sul is an astronomer from Talvey who discovered the comet Sul-3 in 1955."),
    ("Talvey", "Talvey is a mountain town in the Kelran hills, home of the Talvey Observatory."),
    ("Talvey Observatory", "The Talvey Observatory was founded in 1921 and its first director was Lena Sul."),
]
# (id, data_source, question, golden answers)
QA_TRAIN = [
    ("train_0", "nq", "what is the capital of varnholm", ["Ostmar"]),
    ("train_1", "nq", "who wrote the opera the salt harbor", ["Ines Marlow", "Marlow"]),
    ("train_2", "nq", "what is the currency of varnholm", ["crown", "the crown"]),
    ("train_3", "hotpotqa", "In which hills does the river that flows through Ostmar rise?", ["Kelran hills", "the Kelran hills"]),
    ("train_4", "hotpotqa", "When did the theatre where The Salt Harbor was first staged open?", ["1862"]),
    ("train_5", "hotpotqa", "Which river does the bridge designed by Tomas Brell cross?", ["Dunel", "the Dunel"]),
]
QA_TEST = [
    ("test_0", "nq", "who discovered the comet sul-3", ["Lena Sul"]),
    ("test_1", "nq", "how many people does the ostmar royal theatre seat", ["1,400", "1400"]),
    ("test_2", "nq", "when was the dunel bridge completed", ["1907"]),
    ("test_3", "hotpotqa", "In which town was the first director of the Talvey Observatory from?", ["Talvey"]),
    ("test_4", "hotpotqa", "What are the hills where Talvey lies known for?", ["copper mines", "copper"]),
    ("test_5", "hotpotqa", "What is the capital of the kingdom where Ines Marlow is from?", ["Ostmar"]),
]


def luffy_rows(train: bool) -> list[dict]:
  """LUFFY-format rows: the training set with traces, or the evaluation set by data source."""
  rows = []
  if train:
    for i, (question, truth, body, final) in enumerate(MATH_TRAIN):
      trace = f"<think>\n{body}\n</think>\n\nThe answer is $\\boxed{{{final}}}$."
      rows.append({"data_source": "openr1", "prompt": [{"role": "system", "content": RL_SYSTEM},
                                                       {"role": "user", "content": question}],
                   "target": [{"role": "assistant", "content": trace}], "ability": "math",
                   "reward_model": {"ground_truth": truth, "style": "rule"},
                   "extra_info": {"index": i, "split": "default"}})
    return rows
  for i, (source, problem, truth) in enumerate(MATH_EVAL):
    rows.append({"data_source": source, "prompt": [{"role": "system", "content": RL_SYSTEM},
                                                   {"role": "user", "content": problem}],
                 "ability": "math", "reward_model": {"ground_truth": truth, "style": "rule"},
                 "extra_info": {"index": i, "split": "default"}})
  return rows


def search_r1_rows(items, split: str) -> list[dict]:
  return [{"id": id_, "question": q, "golden_answers": list(golden), "data_source": source,
           "prompt": [{"role": "user", "content": SEARCH_R1_TEMPLATE.format(question=q.strip() + ("" if q.endswith("?") else "?"))}],
           "ability": "fact-reasoning", "reward_model": {"ground_truth": {"target": list(golden)}, "style": "rule"},
           "extra_info": {"index": i, "split": split}} for i, (id_, source, q, golden) in enumerate(items)]


def wiki_corpus() -> str:
  return "".join(json.dumps({"id": str(i), "contents": f'"{t}"\n{x}'}) + "\n" for i, (t, x) in enumerate(PASSAGES))


def gsm8k(rng: random.Random, n: int = 8) -> str:
  """GSM8K-style word problems: two steps with calculator annotations, then '#### answer'."""
  rows = []
  for _ in range(n):
    name, item = rng.choice(["Ava", "Omar", "Lena", "Ravi"]), rng.choice(["apples", "stamps", "marbles"])
    boxes, per, extra = rng.randint(2, 9), rng.randint(3, 12), rng.randint(1, 20)
    total = boxes * per + extra
    question = (f"{name} buys {boxes} boxes of {item} with {per} {item} in each box, and finds {extra} more. "
                f"How many {item} does {name} have?")
    answer = (f"The boxes hold {boxes} * {per} = <<{boxes}*{per}={boxes * per}>>{boxes * per} {item}.\n"
              f"With the extra ones, {name} has {boxes * per} + {extra} = <<{boxes * per}+{extra}={total}>>{total} "
              f"{item}.\n#### {total}")
    rows.append({"question": question, "answer": answer})
  return "".join(json.dumps(r) + "\n" for r in rows)


def math_problems(rng: random.Random, n: int = 6) -> str:
  """MATH-style rows: linear equations with a fractional root, solution ending in a boxed answer."""
  from fractions import Fraction
  rows = []
  for i in range(n):
    a, b, c = rng.randint(2, 9), rng.randint(1, 20), rng.randint(21, 60)
    x = Fraction(c - b, a)
    shown = str(x.numerator) if x.denominator == 1 else f"\\frac{{{x.numerator}}}{{{x.denominator}}}"
    rows.append({"problem": f"Solve for $x$: ${a}x + {b} = {c}$.", "level": f"Level {1 + i % 3}",
                 "type": "Algebra", "solution": f"Subtracting {b} gives ${a}x = {c - b}$, so $x = \\boxed{{{shown}}}$."})
  return "".join(json.dumps(r) + "\n" for r in rows)


def build_rl_samples() -> dict:
  """{file name: text (JSON lines) or rows (parquet)} of the RL prompt and benchmark samples."""
  rng = lambda k: random.Random(SEED + k)
  return {
      "luffy_openr1.parquet": luffy_rows(train=True),
      "luffy_valid.parquet": luffy_rows(train=False),
      "search_r1_train.parquet": search_r1_rows(QA_TRAIN, "train"),
      "search_r1_test.parquet": search_r1_rows(QA_TEST, "test"),
      "wiki_corpus.jsonl": wiki_corpus(),
      "gsm8k_test.jsonl": gsm8k(rng(6)),
      "math_test.jsonl": math_problems(rng(7)),
  }


def main(out_dir: pathlib.Path = pathlib.Path(__file__).parent) -> None:
  import pyarrow as pa
  import pyarrow.parquet as pq
  for name, content in {**build_samples(), **build_rl_samples()}.items():
    with atomic_path(out_dir / name) as tmp:
      if isinstance(content, str):
        tmp.write_text(content, encoding="utf-8")
      else:
        pq.write_table(pa.Table.from_pylist(content), tmp)
    print(f"{name}: {(out_dir / name).stat().st_size:,} bytes")


if __name__ == "__main__":
  main()
