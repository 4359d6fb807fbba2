"""The generation engine: paged KV cache, continuous batching, shared prompts (see `engine.Engine`), and the
decoding pieces it shares with `fineflax.sampling`: device steps (`decode`), logits processing and token
sampling (`processors`), prompt checks (`prompts`), stop strings (`stops`)."""
from fineflax.engine.engine import Engine, Request, Sequence
from fineflax.engine.pages import OutOfPages, PageAllocator, pages_for
