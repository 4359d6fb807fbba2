"""benchmarks/serve.py's modes: --random-weights needs no checkpoint and keeps the GPU defaults; --tiny with it is
refused; --no-warmup reaches the server's flags."""
import pytest

from benchmarks import serve as B

pytestmark = pytest.mark.fast


def test_random_weights_keep_the_gpu_levels_and_refuse_tiny(capsys):
  args = B.parse_args(["--random-weights", "--shared-clients", "0"])
  assert args.levels == [1, 32, 128] and args.new_tokens == 64 and args.dtype == "bfloat16" and args.slots == 128
  assert "--warmup" in B.server_args(args, 1, "log")
  with pytest.raises(SystemExit):
    B.parse_args(["--random-weights", "--tiny"])
  assert "pick one" in capsys.readouterr().err
  assert "--no-warmup" in B.server_args(B.parse_args(["--tiny", "--no-warmup"]), 1, "log")
