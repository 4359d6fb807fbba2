"""The Search-R1 agent as a plain agent function: the loop of `fineflax.search_r1.rollout.run_rollouts` for one
question, written against an OpenAI-style client at token level (`llm.complete(token ids)`).

Each turn is one LLM call whose prompt is the question prompt + everything so far (model turns and inserted
passages, as token ids), so the spans' calls continue each other and `merge_transitions` rebuilds exactly the
built-in rollout row (tokens, loss mask 0 on inserted text, log-probs). The search engine is a traced tool.
Differences from the batched built-in loop: a turn's token budget is this row's remaining room, not the
largest room in the batch (identical whenever `max_response_tokens` does not bind), and sampled (T > 0)
rollouts draw other random numbers than one batched `SamplerSession` (greedy rollouts are identical).
Reward: `search_r1_reward` (EM, + `format` / `search` weights).
"""
from __future__ import annotations

from fineflax.agents.tracing import tool
from fineflax.search_r1.actions import cut_at_stop, format_passages, information_text, parse_action
from fineflax.search_r1.rewards import search_r1_reward
from fineflax.search_r1.rollout import RolloutConfig, RolloutResult, prompt_ids


class SearchR1Agent:
  """agent(task, llm, resources) -> reward; task = {"question": str, "answer": str}."""

  def __init__(self, tokenizer, search_fn, config: RolloutConfig = RolloutConfig(), *, temperature=None,
               format_weight: float = 0.0, search_weight: float = 0.0):
    self.tok, self.config, self.temperature = tokenizer, config, temperature
    self.weights = dict(format=format_weight, search=search_weight)
    self.search = tool(lambda queries: search_fn(queries), name="search")

  def run(self, question: str, llm) -> RolloutResult:
    """One rollout (the built-in loop's record for this row)."""
    cfg, tags, tok = self.config, self.config.tags, self.tok
    prompt = prompt_ids(tok, question, cfg)
    row = RolloutResult()
    for turn in range(cfg.max_turns + 1):
      room = cfg.max_response_tokens - len(row.tokens)
      c = llm.complete(prompt + row.tokens, max_tokens=min(cfg.max_turn_tokens, room),
                       stop=list(tags.stop_strings), temperature=self.temperature)
      tokens = list(c.response_ids)[:room]
      logprobs = list(c.raw_logprobs if c.raw_logprobs is not None else c.logprobs)[:len(tokens)]
      text, _ = cut_at_stop(tok.decode(tokens, skip_special_tokens=True), tags.stop_strings)
      row.num_turns += 1
      row._add(tokens, 1.0, logprobs, text)
      row.turn_texts.append(text)
      if len(c.response_ids) > room:  # the completion budget ends inside this turn
        row.finish = "length"
        break
      action, content = parse_action(text, tags)
      if action == "answer":
        row.answer, row.finish = content, "answer"
        break
      if turn == cfg.max_turns:
        break
      if action == "search":
        row.queries.append(content)
        try:
          insert = information_text(format_passages(self.search([content])[0]), tags)
        except Exception as e:  # reported to the model, as the built-in loop does
          insert = information_text(f"search failed: {type(e).__name__}: {e}", tags)
          row.num_search_failures += 1
      else:
        row.num_invalid += 1
        insert = tags.invalid_text
      ids = list(tok(insert, add_special_tokens=False)["input_ids"])
      if len(ids) > cfg.max_obs_tokens:
        ids = ids[:cfg.max_obs_tokens]
        insert = tok.decode(ids, skip_special_tokens=True)
      if len(row.tokens) + len(ids) >= cfg.max_response_tokens:
        row.finish = "length"
        break
      row._add(ids, 0.0, [0.0] * len(ids), insert)
    row.finish = row.finish or "turns"
    return row

  def rollout(self, task, llm, resources) -> float:
    row = self.run(task["question"], llm)
    reward, _ = search_r1_reward(row, [task["answer"]], **self.weights, tags=self.config.tags)
    return reward
