"""Sampling: batched KV-cache decoding with stop strings, tool-output appends and chat formatting."""
from fineflax.sampling.chat import chat_prompt_ids, format_chat
from fineflax.sampling.decode import bucket, decode_chunk, decode_impl, feed_block
from fineflax.sampling.generate import generate
from fineflax.sampling.prompts import prompts_as_lists
from fineflax.sampling.output import SampleOutput
from fineflax.sampling.processors import SamplingConfig, process_logits, sample_tokens
from fineflax.sampling.session import SamplerSession
