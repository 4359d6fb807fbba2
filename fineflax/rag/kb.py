"""The knowledge base of the RAG loop: one corpus, questions in three categories where different retrieval
strategies should win. Everything is a function of (sizes, seed); all names are made up, so no model
knows an answer without the passage.

  keyword     catalogue items that differ only in their code ("Item QX-7741 is a cordless drill ...");
              question "What kind of product is item QX-7741?"  gold: the item's passage; answer: the product.
              The rare code is all that singles the passage out (lexical match: BM25's strength).
  paraphrase  workplace rules, subject x action x time ("Interns may work from home on Fridays if they
              notify their team lead."); the question says it in other words, sharing no content word
              ("Under what condition can trainees telecommute at the end of the week?").  gold: the rule;
              answer: the condition (semantic match: dense retrieval's strength).
  multi_hop   people born in cities, cities in countries ("Ada Mirzen is a painter born in Kaford." /
              "Kaford is a city in Vorland."); question "In which country was Ada Mirzen born?"  gold: the
              CITY's passage (the second hop), which the question does not name; answer: the country.
              One retrieval of the question finds the person, not the city (a search agent's strength).
Each question: {"id", "category", "question", "answer", "gold" (passage id), "split" ("train" | "test")}.
"""
from __future__ import annotations

import itertools

import numpy as np

CATEGORIES = ("keyword", "paraphrase", "multi_hop")
PRODUCTS = ("cordless drill", "angle grinder", "table saw", "heat gun", "orbital sander", "nail gun",
            "jigsaw", "rotary hammer")
ADJECTIVES = ("compact", "heavy-duty", "brushless", "lightweight")
SUBJECTS = (("employees", "staff members"), ("managers", "supervisors"), ("interns", "trainees"),
            ("contractors", "freelancers"), ("visitors", "guests"))
ACTIONS = (("work from home", "telecommute"), ("bring dogs to the office", "have pets at their desks"),
           ("park in the garage", "leave vehicles in the covered lot"), ("expense taxi rides", "claim cab fares"),
           ("wear sandals", "put on open footwear"), ("use the gym", "exercise at the fitness centre"))
TIMES = (("on Fridays", "at the end of the week"), ("in summer", "during the warm months"),
         ("after 6 pm", "in the evening"), ("during holidays", "over vacation periods"))
CONDITIONS = ("notify their team lead", "sign a waiver", "log the hours", "get written approval",
              "book in advance", "pay a deposit", "finish safety training", "wear a badge")
SYLLABLES = ("ka", "lo", "mir", "zen", "tha", "vor", "ul", "bre", "sin", "dor", "qua", "fel", "ix", "ro",
             "nai", "pel", "tur", "gan", "shi", "mab", "ost", "ri", "cav", "jun", "wex")
PROFESSIONS = ("painter", "engineer", "chemist", "poet", "architect", "botanist", "composer", "surgeon")


def _name(rng, taken, parts=2, suffix=""):
  while True:
    word = ("".join(rng.choice(SYLLABLES, parts)) + suffix).capitalize()
    if word not in taken:
      taken.add(word)
      return word


def make_kb(per_category: int = 120, test_fraction: float = 0.25, seed: int = 0):
  """(documents [{"id", "title", "text"}], questions) of the module docstring."""
  rng = np.random.default_rng(seed)
  docs, questions = [], []

  def add_q(category, i, question, answer, gold):
    questions.append({"id": f"{category}-{i}", "category": category, "question": question, "answer": answer,
                      "gold": gold})

  codes = rng.choice(np.arange(1000, 10000), per_category, replace=False)
  for i, code in enumerate(codes):
    code = f"{rng.choice(['QX', 'QZ', 'XQ'])}-{code}"
    product = f"{rng.choice(ADJECTIVES)} {rng.choice(PRODUCTS)}"
    docs.append({"id": f"item-{i}", "title": f"Item {code}",
                 "text": f"Item {code} is a {product} from the workshop catalogue, sold with a "
                         f"{int(rng.integers(1, 5))}-year warranty."})
    add_q("keyword", i, f"What kind of product is item {code}?", product, f"item-{i}")

  rules = list(itertools.product(range(len(SUBJECTS)), range(len(ACTIONS)), range(len(TIMES))))
  for i, r in enumerate(rng.permutation(len(rules))[:per_category]):
    s, a, t = rules[r]
    cond = str(rng.choice(CONDITIONS))
    docs.append({"id": f"rule-{i}", "title": "Workplace rule",
                 "text": f"{SUBJECTS[s][0].capitalize()} may {ACTIONS[a][0]} {TIMES[t][0]} if they {cond}."})
    add_q("paraphrase", i, f"Under what condition can {SUBJECTS[s][1]} {ACTIONS[a][1]} {TIMES[t][1]}?", cond,
          f"rule-{i}")

  taken: set[str] = set()
  countries = [_name(rng, taken, 2, suffix) for suffix in ("ia", "land", "ora", "stan", "mar", "eth")]
  cities = [_name(rng, taken, 2, str(rng.choice(["ford", "grad", "vik", "holm", "port"]))) for _ in range(40)]
  for j, c in enumerate(countries):
    docs.append({"id": f"country-{j}", "title": c, "text": f"{c} is a country on the northern sea."})
  city_country = {}
  for j, c in enumerate(cities):
    city_country[c] = countries[j % len(countries)]
    docs.append({"id": f"city-{j}", "title": c, "text": f"{c} is a city in {city_country[c]}."})
  for i in range(per_category):
    person = f"{_name(rng, taken)} {_name(rng, taken, 3)}"
    j = int(rng.integers(len(cities)))
    docs.append({"id": f"person-{i}", "title": person,
                 "text": f"{person} is a {rng.choice(PROFESSIONS)} born in {cities[j]} in "
                         f"{int(rng.integers(1900, 2000))}."})
    add_q("multi_hop", i, f"In which country was {person} born?", city_country[cities[j]], f"city-{j}")

  test = set(rng.permutation(len(questions))[:int(round(test_fraction * len(questions)))].tolist())
  for i, q in enumerate(questions):
    q["split"] = "test" if i in test else "train"
  return docs, questions
