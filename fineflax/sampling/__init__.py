"""Sampling: `generate` and `SamplerSession` on the generation engine (`fineflax.engine`, which also holds the
decoding steps, token sampling, prompt checks and stop strings re-exported here), tool-output appends and chat
formatting."""
from fineflax.engine.decode import bucket, decode_chunk, decode_impl, feed_block
from fineflax.engine.processors import SamplingConfig, process_logits, sample_tokens
from fineflax.engine.prompts import prompts_as_lists
from fineflax.sampling.chat import chat_prompt_ids, format_chat
from fineflax.sampling.generate import generate
from fineflax.sampling.output import SampleOutput
from fineflax.sampling.session import SamplerSession
