"""feplb.torch with torchrun, one process per GPU (torch_dist_check.py). Skipped with the reason
on fewer than two GPUs or without torch with CUDA."""

import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")


def test_two_processes_over_nccl_match_the_reference():
    if not torch.cuda.is_available() or torch.cuda.device_count() < 2:
        pytest.skip(f"needs 2 GPUs, {torch.cuda.device_count() if torch.cuda.is_available() else 0} visible")
    script = os.path.join(os.path.dirname(__file__), "torch_dist_check.py")
    env = dict(os.environ, NCCL_NVLS_ENABLE="0")
    run = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", script],
                         env=env, capture_output=True, text=True, timeout=600)
    print(run.stdout[-4000:])
    print(run.stderr[-4000:])
    assert run.returncode == 0, "torchrun failed; see the output above"
