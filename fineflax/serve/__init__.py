"""Serving: an OpenAI-compatible chat server over one (quantised) base and several LoRA adapters.

  python -m fineflax.serve --model SOURCE [--adapter NAME=PATH ...] [--quant nf4|int8|none] --port P

engine.py    the server's requests (n, stop strings, streamed text, log-probs) on `fineflax.engine`:
             continuous batching over a paged KV cache with per-row LoRA, one thread driving it
protocol.py  the chat-completions wire format (validation, response and chunk objects)
app.py       the Starlette app: chat completions, models, feedback, reward statistics
feedback.py  the SQLite (WAL) reward log; its schema is the contract of the log -> SFT exporter
router.py    UCB1 / Thompson routing of model="auto" on the logged rewards
"""
