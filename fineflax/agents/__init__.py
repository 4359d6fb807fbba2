"""Agents trained from their traces (Agent Lightning's two halves, natively): plain-Python agents
`(task, llm, resources) -> reward`, OpenAI-style LLM clients (`llm`), tracing into spans (`tracing`), a SQLite
store (`store`), threaded runners (`runner`), spans -> RL transitions (`transitions`), automatic prompt
optimisation (`apo`), and two agents: `calculator` and `search_r1`."""
from fineflax.agents.llm import LLM, Completion, LocalLLM, OpenAILLM, ScriptedLLM
from fineflax.agents.runner import RolloutRecord, run_one, run_rollouts
from fineflax.agents.store import Store
from fineflax.agents.tracing import Span, Tracer, emit_reward, tool, tracing
from fineflax.agents.transitions import Transition, credit, merge_transitions, rollout_transitions, transition_batch
from fineflax.rl.advantages import group_advantages  # groups by task id: `group_advantages(rewards, ids, scale)`
