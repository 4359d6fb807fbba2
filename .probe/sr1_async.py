import sys, json
from fineflax.jobs import rl as rl_job
from fineflax.jobs.resolve import load_config
from fineflax.testing.models import *  # noqa
