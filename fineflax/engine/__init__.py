"""The generation engine: paged KV cache, continuous batching, shared prompts, per-row LoRA adapters (see
`engine.Engine`: requests and sequences in `sequence`, admission and preemption in `schedule`, the device
calls of a step in `calls`, compiled programs in `programs`; `driver.EngineThread` drives one from a thread
for servers and agents), and the decoding pieces it shares with `fineflax.sampling`: device steps (`decode`),
logits processing and token sampling (`processors`), prompt checks (`prompts`), stop strings (`stops`)."""
from fineflax.engine.engine import Engine, Request, Sequence
from fineflax.engine.pages import OutOfPages, PageAllocator, pages_for
