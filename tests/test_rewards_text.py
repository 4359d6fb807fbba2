"""format, exact_match (SQuAD normalisation parity), chat, combined dispatch."""
import random
import re
import string

import pytest

from fineflax.rewards import extract_answer, get_reward, normalize_answer
from fineflax.rewards.combined import detect_task

pytestmark = pytest.mark.fast


def squad_v11_normalize_answer(s):
  """Independent transcription of normalize_answer in the official SQuAD v1.1 evaluate script."""
  def remove_articles(text):
    return re.sub(r'\b(a|an|the)\b', ' ', text)

  def white_space_fix(text):
    return ' '.join(text.split())

  def remove_punc(text):
    exclude = set(string.punctuation)
    return ''.join(ch for ch in text if ch not in exclude)

  def lower(text):
    return text.lower()

  return white_space_fix(remove_articles(remove_punc(lower(s))))


def test_normalize_answer_matches_squad_reference():
  rng = random.Random(0)
  alphabet = list(string.ascii_letters + string.punctuation + " \t\n") + ["the ", "A ", "an ", "The", "éÀ", "theatre"]
  texts = ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 40))) for _ in range(500)]
  texts += ["The  Eiffel-Tower!", "a an the", "An apple, a day.", "(the) answer's 42%"]
  for text in texts:
    assert normalize_answer(text) == squad_v11_normalize_answer(text), text


@pytest.mark.parametrize("completion,golden,expected", [
    ("<think>..</think><answer> The Eiffel Tower. </answer>", "eiffel tower", 1.0),
    ("<answer>Paris</answer> <answer>London</answer>", ["london", "LONDON!"], 1.0),
    ("<answer>Paris</answer>", ["London"], 0.0),
    ("Barack Obama", "barack obama", 0.0),  # no <answer>: 0, as Search-R1's qa_em
    ("<answer>Obama</answer", "obama", 0.0),  # unclosed tag: no answer
])
def test_exact_match(completion, golden, expected):
  assert get_reward("exact_match")("", completion, golden_answers=golden) == expected


SEARCH_R1_PREFIX = (  # Search-R1's training prompt (scripts/data_process/nq_search.py, template "base")
    "Answer the given question. You must conduct reasoning inside <think> and </think> first every time you get "
    "new information. After reasoning, if you find you lack some knowledge, you can call a search engine by "
    "<search> query </search> and it will return the top searched results between <information> and "
    "</information>. You can search as many times as your want. If you find no further external knowledge "
    "needed, you can directly provide the answer inside <answer> and </answer>, without detailed illustrations. "
    "For example, <answer> Beijing </answer>. Question: who wrote hamlet?\n")


def search_r1_compute_score_em(solution_str, ground_truth, format_score=0., score=1.):
  """Transcribed from Search-R1 verl/utils/reward_score/qa_em.py (extract_solution, em_check): the reward
  manager passes prompt + response, so the prompt's example answer is one of the matches."""
  matches = list(re.finditer(r'<answer>(.*?)</answer>', solution_str, re.DOTALL))
  if len(matches) <= 1:
    return 0
  answer = matches[-1].group(1).strip()
  golden_answers = ground_truth['target']
  if isinstance(golden_answers, str):
    golden_answers = [golden_answers]
  prediction = squad_v11_normalize_answer(answer)
  return score if any(squad_v11_normalize_answer(g) == prediction for g in golden_answers) else format_score


@pytest.mark.parametrize("completion", [
    "<think>easy</think><answer> William Shakespeare </answer>", "<answer>shakespeare</answer>",
    "<answer>Marlowe</answer> wait <answer>The Shakespeare.</answer>", "no answer at all", "<answer>Shakespeare",
    "<search>hamlet author</search><information>Doc 1</information><answer>william shakespeare!</answer>",
    "<answer></answer>", "</answer><answer>Shakespeare</answer>", "<answer>a shakespeare</answer><answer>",
])
def test_exact_match_equals_search_r1_qa_em(completion):
  truth = {"target": ["William Shakespeare", "Shakespeare"]}
  expected = search_r1_compute_score_em(SEARCH_R1_PREFIX + completion, truth)
  assert get_reward("exact_match")(SEARCH_R1_PREFIX, completion, golden_answers=truth) == expected


@pytest.mark.parametrize("completion,golden,expected", [
    ("<answer>Paris</answer>", ["London"], 0.0),
    ("<answer> The Eiffel Tower. </answer>", "eiffel tower", 1.0),
    ("Barack Obama", "barack obama", 1.0),  # no <answer>: the whole text is compared
    ("<answer>Obama</answer", "obama", 0.0),  # unclosed tag: whole text, which holds the tag words
])
def test_exact_match_lenient(completion, golden, expected):
  assert get_reward("exact_match_lenient")("", completion, golden_answers=golden) == expected


def test_extract_answer():
  assert extract_answer("<answer>a</answer> x <answer>\n b \n</answer>") == "b"
  assert extract_answer("<answer>unclosed") is None


@pytest.mark.parametrize("text,expected", [
    ("<think>reason</think><answer>4</answer>", 1.0),
    ("  <think>a\nb</think>\n\n<answer>4</answer>\n", 1.0),
    ("<think>reason</think>", 0.0),
    ("<think>reason<answer>4</answer>", 0.0),
    ("<think>a</think><answer>4", 0.0),
    ("<think>a</think><answer>4</answer> trailing", 0.0),
    ("<think>a</think><think>b</think><answer>4</answer>", 0.0),
    ("<think>a</think><answer>4</answer><answer>5</answer>", 0.0),
    ("<think><think>a</think></think><answer>4</answer>", 0.0),
    ("<answer>4</answer><think>a</think>", 0.0),
])
def test_format(text, expected):
  assert get_reward("format")("", text) == expected


def test_chat_reward_components():
  chat = get_reward("chat")
  prompt = "Tell me something about the moon and its phases please"
  good = ("The moon goes through phases because we see different portions of its sunlit half as it orbits "
          "Earth over roughly twenty nine days.")
  assert chat(prompt, good) == pytest.approx(1.0)
  assert chat(prompt, "") == 0.0
  assert chat(prompt, " ".join(["blah blah blah"] * 20)) < 0.75  # repetition
  assert chat(prompt, prompt + " " + prompt) < chat(prompt, good)  # copying the prompt
  assert chat(prompt, "Yes.") < chat(prompt, good)  # too short
  assert 0.0 <= chat(prompt, " ".join(f"w{i}" for i in range(2000))) <= 1.0


def test_combined_detection_and_dispatch():
  tools = [{"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}]
  assert detect_task("anything", {"tests": ["assert True"]}) == "code"
  assert detect_task("Call the function you need", {"tools": tools}) == "function_call"
  assert detect_task("Write a Python function that reverses a list", {}) == "code"
  assert detect_task("How are you today?", {}) == "chat"
  combined = get_reward("combined")
  call = '{"name": "get_weather", "arguments": {"city": "Oslo"}}'
  assert combined("Weather in Oslo?", call, tools=tools) == get_reward("function_call")("", call, tools=tools) == 1.0
  assert combined("Write a function f", "```python\ndef f(): return 1\n```", tests=["assert f() == 1"]) == 1.0
  assert combined("Hi there", "Hello!") == get_reward("chat")("Hi there", "Hello!")
