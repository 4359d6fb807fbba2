"""HTTP-speaking agents: the traced OpenAI-compatible proxy records their calls into the rollout's spans with
token ids, and an Agent Lightning agent runs under our runner through the thin adapter (when installed)."""
from __future__ import annotations

import pytest

from fineflax.agents import ScriptedLLM, Store, run_rollouts
from fineflax.agents.proxy import LLMProxy
from fineflax.agents.tracing import current


@pytest.fixture(scope="module")
def tok():
  from fineflax.models import load_tokenizer
  return load_tokenizer("smollm2-135m-instruct")


@pytest.mark.fast
def test_proxy_traces_http_calls_with_token_ids(tok):
  proxy = LLMProxy()
  llm = ScriptedLLM(lambda req, i: " six" if isinstance(req[0], int) else "The answer is 5.", tokenizer=tok, eos_id=2)
  seen = []

  def http_agent(task, llm, resources):  # talks HTTP through its own (plain openai) client
    from openai import OpenAI
    url = proxy.endpoint(current(), llm)
    client = OpenAI(base_url=url, api_key="none")
    c = client.chat.completions.create(model="m", messages=[{"role": "user", "content": task["q"]}], max_tokens=8)
    d = client.completions.create(model="m", prompt=[1, 2, 3], max_tokens=2)
    seen.append((c.choices[0].model_extra["token_ids"], d.choices[0].text))
    proxy.release(url)
    return float("5" in c.choices[0].message.content)

  store = Store()
  recs = run_rollouts(http_agent, [{"q": "2+3?"}, {"q": "1+4?"}], llm, {}, store, num_workers=2)
  assert [r.reward for r in recs] == [1.0, 1.0]
  for r in recs:
    spans = [s.attributes for s in store.spans(rollout_id=r.rollout_id, kind="llm")]
    assert len(spans) == 2 and spans[1]["prompt_ids"] == [1, 2, 3]
    chat = spans[0]
    assert chat["response_ids"] == list(tok("The answer is 5.", add_special_tokens=False)["input_ids"]) + [2]
    assert chat["request"] == [{"role": "user", "content": r.task["q"]}] and r.task["q"] in tok.decode(chat["prompt_ids"])
  assert seen[0] == (chat["response_ids"], " six")  # the client got the token ids back
  # a released route is gone
  assert not proxy.routes
  proxy.close()


def test_agentlightning_agent_runs_under_our_runner(tok):
  agl = pytest.importorskip("agentlightning")
  from fineflax.agents.agl import from_agentlightning
  from openai import OpenAI

  @agl.rollout
  def agl_agent(task, llm: agl.LLM, prompt_template: agl.PromptTemplate) -> float:
    client = OpenAI(base_url=llm.endpoint, api_key="none")
    r = client.chat.completions.create(model=llm.model, messages=[
        {"role": "system", "content": prompt_template.format()}, {"role": "user", "content": task["q"]}])
    return 1.0 if r.choices[0].message.content.strip() == task["a"] else 0.0

  llm = ScriptedLLM(lambda req, i: "5", tokenizer=tok, eos_id=2)
  proxy = LLMProxy()
  store = Store()
  recs = run_rollouts(from_agentlightning(agl_agent, proxy), [{"q": "2+3?", "a": "5"}, {"q": "2+2?", "a": "4"}], llm,
                      {"prompt_template": "Answer with a number."}, store)
  assert [r.reward for r in recs] == [1.0, 0.0]
  spans = store.spans(kind="llm")
  assert len(spans) == 2 and spans[0].attributes["request"][0]["content"] == "Answer with a number."
  assert spans[0].attributes["response_ids"] == list(tok("5", add_special_tokens=False)["input_ids"]) + [2]
  proxy.close()
