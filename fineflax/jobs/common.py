"""Old import path of pieces the jobs share, now in the modules of their purpose:
model setup `fineflax.train.model_setup`, the chat answer `fineflax.sampling.answer`, the workdir and run
summary `fineflax.train.workdir`, micro-batch stacking `fineflax.train.sft_step`. New code imports from there."""
from fineflax.sampling.answer import answer  # noqa: F401
from fineflax.train.model_setup import compute_dtype, export_adapter, setup_model, start_adapter  # noqa: F401
from fineflax.train.sft_step import stack_micro_batches  # noqa: F401
from fineflax.train.workdir import finish_run, make_workdir, preflight, saved_summary  # noqa: F401
