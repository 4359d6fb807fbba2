"""The generation engine: paged KV cache, continuous batching, shared prompts (see `engine.Engine`)."""
from fineflax.engine.engine import Engine, Request, Sequence
from fineflax.engine.pages import OutOfPages, PageAllocator, pages_for
