"""A generated knowledge base of fictional entities, so that answers cannot be known without searching.

Entities (names from random syllables, unique): countries; cities (each in a country); people (each born
in a city in a year, each founding one company); companies (founder, year, headquarters city).
One passage per entity, titled with its name. Questions, each with its answer and a demonstration trace
(the correct searches, used for LUFFY off-policy guidance):
  single-hop: Where was P born? | Which company did P found? | Who founded K? |
              In which city is K headquartered? | In which country is C?
  two-hop:    In which country is the city where P was born? | Where was the founder of K born? |
              In which country is K headquartered?
Split: people (with their companies) and cities are split train / held-out at random, and the world is
split with them: a held-out person is born in a held-out city and their company is headquartered in one;
a training person's cities are training cities. A question belongs to its anchor entity (P or K -> the
person; C -> the city). So every fact a held-out question needs ("P was born in C", "C is in X", ...) is a
fact of held-out entities, and no training question, demonstration or prompt names a held-out person,
company or city (countries, the answers of the country questions, are shared). The corpus holds every
entity's passage: held-out questions must be answerable by search.
Everything is a function of (sizes, seed).
"""
from __future__ import annotations

import dataclasses
import json

import numpy as np

from fineflax.io import atomic_write_text

SYLLABLES = ("ka", "lo", "mir", "zen", "tha", "vor", "ul", "bre", "sin", "dor", "qua", "fel", "ix", "ro",
             "nai", "pel", "tur", "gan", "shi", "el", "mab", "ost", "ri", "cav", "jun", "wex", "ta", "bo")
PROFESSIONS = ("painter", "engineer", "chemist", "poet", "architect", "botanist", "composer", "surgeon")
INDUSTRIES = ("shipping", "textile", "software", "brewing", "mining", "robotics", "publishing", "glass")
COMPANY_SUFFIX = ("Labs", "Works", "Systems", "Foods", "Motors", "Textiles", "Holdings", "Optics")
CITY_SUFFIX = ("ford", "grad", "vik", "holm", "port", "mere", "stad", "burg")
COUNTRY_SUFFIX = ("ia", "land", "ora", "stan", "mar", "eth")
RIVERS = ("Olm", "Varra", "Tesk", "Quill", "Amber", "Sorrow")


@dataclasses.dataclass(frozen=True)
class Question:
  """question, answer (golden string), hops (1 | 2), kind, split ("train" | "test") and demo: the model
  turns of a correct Search-R1 trace (searches, then the answer)."""
  id: str
  question: str
  answer: str
  hops: int
  kind: str
  split: str
  demo: tuple[str, ...]


@dataclasses.dataclass
class KnowledgeBase:
  documents: list[dict]  # {"id", "title", "text"}
  questions: list[Question]

  def split(self, name: str) -> list[Question]:
    return [q for q in self.questions if q.split == name]

  def write_corpus(self, path: str) -> None:
    """JSON lines {id, title, text} (readable by `retrieval.read_jsonl` and `retrieval.server`)."""
    atomic_write_text(path, "".join(json.dumps(d) + "\n" for d in self.documents))


def _names(rng, count, syllables, suffixes, taken, title=True):
  out = []
  while len(out) < count:
    word = "".join(rng.choice(SYLLABLES, syllables)) + (rng.choice(suffixes) if suffixes else "")
    word = word.capitalize() if title else word
    if word not in taken:
      taken.add(word)
      out.append(word)
  return out


def _a(word: str) -> str:
  return f"{'an' if word[0] in 'aeiou' else 'a'} {word}"


def _think_search(thought: str, query: str) -> str:
  return f"<think>{thought}</think>\n<search> {query} </search>"


def _think_answer(thought: str, answer: str) -> str:
  return f"<think>{thought}</think>\n<answer> {answer} </answer>"


def make_kb(num_people: int = 200, num_cities: int = 40, num_countries: int = 10,
            test_fraction: float = 0.2, seed: int = 0) -> KnowledgeBase:
  """The knowledge base of the module docstring (deterministic in all arguments)."""
  if min(num_people, num_cities, num_countries) < 1 or not 0 <= test_fraction < 1:
    raise ValueError(f"make_kb: need positive sizes and 0 <= test_fraction < 1, got people={num_people}, "
                     f"cities={num_cities}, countries={num_countries}, test_fraction={test_fraction}")
  rng = np.random.default_rng(seed)
  taken: set[str] = set()
  countries = _names(rng, num_countries, 2, COUNTRY_SUFFIX, taken)
  cities = _names(rng, num_cities, 2, CITY_SUFFIX, taken)
  firsts = _names(rng, num_people, 2, (), taken)
  lasts = _names(rng, num_people, 3, (), taken)
  people = [f"{a} {b}" for a, b in zip(firsts, lasts)]
  companies = [f"{w} {rng.choice(COMPANY_SUFFIX)}" for w in _names(rng, num_people, 2, (), taken)]
  city_country = {c: countries[i % num_countries] if i < num_countries else str(rng.choice(countries))
                  for i, c in enumerate(cities)}
  n_test_people = int(round(test_fraction * num_people))
  n_test_cities = max(int(round(test_fraction * num_cities)), 1 if n_test_people else 0)
  if n_test_cities >= num_cities and n_test_people < num_people:
    raise ValueError(f"make_kb: {num_cities} cities leave none for the training people (test_fraction="
                     f"{test_fraction}); use more cities")
  test_people = set(rng.permutation(people)[:n_test_people].tolist())
  test_cities = set(rng.permutation(cities)[:n_test_cities].tolist())
  cities_of = {True: sorted(test_cities, key=cities.index), False: [c for c in cities if c not in test_cities]}
  founded = dict(zip(people, companies))
  born = {p: str(rng.choice(cities_of[p in test_people])) for p in people}  # a person's cities share their split
  hq = {founded[p]: str(rng.choice(cities_of[p in test_people])) for p in people}
  docs = [{"id": f"country-{i}", "title": c,
           "text": f"{c} is a country. Its largest river is the {rng.choice(RIVERS)}."}
          for i, c in enumerate(countries)]
  docs += [{"id": f"city-{i}", "title": c,
            "text": f"{c} is a city in {city_country[c]}. About {int(rng.integers(20, 900)) * 1000} people "
                    "live there."} for i, c in enumerate(cities)]
  for i, p in enumerate(people):
    year = int(rng.integers(1900, 2000))
    docs.append({"id": f"person-{i}", "title": p,
                 "text": f"{p} is {_a(rng.choice(PROFESSIONS))} who was born in {born[p]} in {year}. "
                         f"{p} founded the company {founded[p]}."})
    k = founded[p]
    docs.append({"id": f"company-{i}", "title": k,
                 "text": f"{k} is {_a(rng.choice(INDUSTRIES))} company founded by {p} in "
                         f"{year + int(rng.integers(20, 40))}. Its headquarters are in {hq[k]}."})
  questions: list[Question] = []

  def add(anchor_is_test, kind, hops, text, answer, demo):
    split = "test" if anchor_is_test else "train"
    questions.append(Question(f"{kind}-{len(questions)}", text, answer, hops, kind, split, tuple(demo)))

  for p in people:
    t, k, c = p in test_people, founded[p], born[p]
    add(t, "birthplace", 1, f"Where was {p} born?", c,
        [_think_search(f"I need to find where {p} was born.", p), _think_answer(f"{p} was born in {c}.", c)])
    add(t, "founded", 1, f"Which company did {p} found?", k,
        [_think_search(f"I need to find the company {p} founded.", p), _think_answer(f"{p} founded {k}.", k)])
    add(t, "founder", 1, f"Who founded {k}?", p,
        [_think_search(f"I need to find who founded {k}.", k), _think_answer(f"{k} was founded by {p}.", p)])
    add(t, "headquarters", 1, f"In which city is {k} headquartered?", hq[k],
        [_think_search(f"I need to find where {k} is headquartered.", k),
         _think_answer(f"{k} is headquartered in {hq[k]}.", hq[k])])
    add(t, "birth-country", 2, f"In which country is the city where {p} was born?", city_country[c],
        [_think_search(f"I need to find where {p} was born.", p),
         _think_search(f"{p} was born in {c}. Now I need the country of {c}.", c),
         _think_answer(f"{c} is in {city_country[c]}.", city_country[c])])
    add(t, "founder-birthplace", 2, f"Where was the founder of {k} born?", c,
        [_think_search(f"I need to find who founded {k}.", k),
         _think_search(f"{k} was founded by {p}. Now I need where {p} was born.", p),
         _think_answer(f"{p} was born in {c}.", c)])
    add(t, "hq-country", 2, f"In which country is {k} headquartered?", city_country[hq[k]],
        [_think_search(f"I need to find where {k} is headquartered.", k),
         _think_search(f"{k} is headquartered in {hq[k]}. Now I need the country of {hq[k]}.", hq[k]),
         _think_answer(f"{hq[k]} is in {city_country[hq[k]]}.", city_country[hq[k]])])
  for c in cities:
    add(c in test_cities, "city-country", 1, f"In which country is {c}?", city_country[c],
        [_think_search(f"I need to find the country of {c}.", c),
         _think_answer(f"{c} is in {city_country[c]}.", city_country[c])])
  return KnowledgeBase(docs, questions)
