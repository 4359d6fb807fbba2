"""A job step that sends this process SIGTERM after a given step (the loop's stop handling under test)."""
import os
import signal


def sigterm_after(step_fn, at: int):
  """step_fn(self, state, i) wrapped: after step `at` returns, SIGTERM to this process (polled by the loop)."""
  def step_then_sigterm(self, state, i):
    out = step_fn(self, state, i)
    if i == at:
      os.kill(os.getpid(), signal.SIGTERM)
    return out
  return step_then_sigterm
