"""PyTorch peers: skipped with a clear record where torch is missing; on a GPU with torch, checked."""
import importlib.util
import json
import os

import pytest

from flashbench import gpu
from flashbench.check import Gate, check_kernel
from flashbench.cli import main
from flashbench.config import Shape

HAVE_TORCH = importlib.util.find_spec("torch") is not None


@pytest.mark.skipif(HAVE_TORCH, reason="torch is installed here")
def test_without_torch_a_peer_is_skipped_and_never_timed(tmp_path, settings, monkeypatch):
    """On a GPU (a stub nvidia-smi: the peer asks for it first) without torch."""
    smi = tmp_path / "bin" / "nvidia-smi"
    smi.parent.mkdir()
    smi.write_text("#!/bin/sh\necho 'NVIDIA H200, 9.0'\n")
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{smi.parent}:{os.environ['PATH']}")
    peer = json.dumps(settings.peers[0].as_dict())
    shape = json.dumps(settings.case.as_dict())
    check, bench = tmp_path / "check.json", tmp_path / "bench.json"
    assert main(["check", "--peer", peer, "--shapes", f"[{shape}]", "--factor", "2", "--tolerance", "0.005",
                 "--out", str(check)]) == 0
    record = json.loads(check.read_text())
    assert record == {"kernel": settings.peers[0].name, "gate": {"factor": 2.0, "tolerance": 0.005}, "passed": False,
                      "skipped": "torch is not installed", "reason": "skipped: torch is not installed", "shapes": []}
    assert main(["bench", "--peer", peer, "--check", str(check), "--shape", shape, "--steps", "1", "--repeats", "1",
                 "--warmup", "0", "--graph-replays", "1", "--out", str(bench)]) == 0
    assert json.loads(bench.read_text()) == {"kernel": settings.peers[0].name, "timed": False,
                                             "reason": "skipped: torch is not installed"}


@pytest.mark.gpu
@pytest.mark.skipif(not HAVE_TORCH, reason="torch is not installed")
@pytest.mark.parametrize("index", range(5))
def test_each_peer_matches_the_fp32_reference(settings, index):
    from flashbench.peers import TorchPeer

    gpu.require()
    peer = TorchPeer(settings.peers[index])
    result = check_kernel(peer, [Shape(1, 4, 1024, 128), Shape(2, 3, 384, 128)],
                          Gate(settings.check_factor, settings.tolerance), progress=lambda m: None)
    assert result["passed"], result["reason"]
    assert peer.identity["backend"] == settings.peers[index].backend
