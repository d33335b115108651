"""`genforge ARGS...` with test stand-ins, run plainly or under torchrun (tests/test_cli_scale.py):

- the FID feature network is eval_standins.TinyFeatures (Inception-v3 takes a minute on a CPU);
- GENFORGE_TEST_FAIL_RANK=r: rank r's encoder raises on its third call, once it wrote shards (a failure on one
  rank of an encode).
"""

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent / "eval"))

from eval_standins import TinyFeatures  # noqa: E402
from genforge import cli  # noqa: E402
from genforge.app import encode as encode_module  # noqa: E402
from genforge.eval import metrics as metrics_module  # noqa: E402

net = TinyFeatures()
metrics_module.feature_network = lambda device: net
failing = os.environ.get("GENFORGE_TEST_FAIL_RANK")
if failing is not None and os.environ.get("RANK", "0") == failing:
    real, calls = encode_module._encode, []

    def _encode(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise RuntimeError(f"injected failure on rank {failing}")
        return real(*args, **kwargs)

    encode_module._encode = _encode
sys.argv = ["genforge", *sys.argv[1:]]
cli.main()
