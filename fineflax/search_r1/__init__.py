"""Search-R1: multi-turn reasoning with a search tool (rollouts, rewards, inference, a generated KB)."""
from fineflax.search_r1.actions import (INVALID_ACTION_TEXT, SEARCH_R1_PROMPT, Passage, Tags, build_prompt,
                                        format_passages, information_text, parse_action,
                                        turn_is_well_formed)
from fineflax.search_r1.inference import ReasoningResult, ReasoningWithSearch, rollout_batch
from fineflax.search_r1.kb import KnowledgeBase, Question, make_kb
from fineflax.search_r1.policy import LLMPolicy, Policy, SamplerPolicy, ScriptedPolicy, Turn
from fineflax.search_r1.rewards import search_r1_reward, well_formed
from fineflax.search_r1.rollout import (RolloutConfig, RolloutResult, prompt_ids, run_rollouts,
                                        session_length)
from fineflax.search_r1.tools import SearchTimeout, make_search_fn, to_passage
