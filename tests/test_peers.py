"""PyTorch peers: skipped with a clear record where torch is missing; on a GPU with torch, checked."""
import importlib.util
import json
from types import SimpleNamespace

import pytest

from flashbench import config, gpu, peers
from flashbench.check import Gate, check_kernel
from flashbench.cli import main
from flashbench.config import Shape

from conftest import ROOT, a_gpu_here

HAVE_TORCH = importlib.util.find_spec("torch") is not None


@pytest.mark.skipif(HAVE_TORCH, reason="torch is installed here")
def test_without_torch_a_peer_is_skipped_and_never_timed(tmp_path, settings, settings_file, monkeypatch):
    """On a GPU (a stub nvidia-smi: the peer asks for it first) without torch."""
    monkeypatch.setenv("PATH", a_gpu_here(tmp_path)["PATH"])
    monkeypatch.chdir(ROOT)
    name = settings.peers[0].name  # each record is filed under its kernel's or peer's name
    check, bench = tmp_path / "check" / f"{name}.json", tmp_path / "bench" / f"{name}.json"
    assert main(["check", "--settings", settings_file, "--peer", name, "--out", str(check)]) == 0
    record = json.loads(check.read_text())
    assert record == {"kernel": settings.peers[0].name, "configuration": "dense", "gate": {"factor": 2.0, "tolerance": 0.005},
                      "passed": False, "skipped": "torch is not installed", "reason": "skipped: torch is not installed",
                      "shapes": [], "inputs_sha256": {}}
    causal = tmp_path / "check" / f"{name}.causal.json"  # the same peer in another configuration: a run of its own
    assert main(["check", "--settings", settings_file, "--peer", f"{name}.causal", "--out", str(causal)]) == 0
    assert {k: json.loads(causal.read_text())[k] for k in ("kernel", "configuration", "passed")} == {
        "kernel": f"{name}.causal", "configuration": "causal", "passed": False}
    assert main(["bench", "--settings", settings_file, "--peer", name, "--check", str(check), "--out", str(bench)]) == 0
    assert json.loads(bench.read_text()) == {"kernel": settings.peers[0].name, "configuration": "dense", "timed": False,
                                             "reason": "skipped: torch is not installed", "inputs_sha256": {}}


def test_flashattention_is_skipped_with_its_reason_where_its_package_is_missing(settings, monkeypatch):
    flash_attn_cute = next(p for p in settings.peers if p.backend == peers.FLASH_ATTN_CUTE)
    sdpa = next(p for p in settings.peers if p.backend == "auto")
    installed = {"torch"}
    monkeypatch.setattr(peers, "installed_version", lambda name: "1.0" if name in installed else None)
    with pytest.raises(peers.PeerUnavailable, match="flash-attn-4 .* is not installed"):
        peers.require(flash_attn_cute)
    peers.require(sdpa)  # torch alone is enough for SDPA
    installed.clear()
    for peer in (flash_attn_cute, sdpa):
        with pytest.raises(peers.PeerUnavailable, match="torch is not installed"):
            peers.require(peer)


def test_a_peer_keeps_the_tensors_of_every_input_set_at_one_shape(monkeypatch):
    """The cycle counts make seven sets of inputs at a shape before they profile; FlashAttention's
    copy to its layout must be made for each set then, not again inside the profiled range."""
    made = []

    class Array:  # what the cache needs of a CuPy array: its device pointer
        def __init__(self):
            self.data = SimpleNamespace(ptr=len(made) + 1)
            made.append(self)

    monkeypatch.setattr(peers.attention, "random_inputs", lambda cp, shape, rng, kind, dtype, kv_heads:
                        tuple(Array() for _ in range(4)))
    peer = object.__new__(peers.FlashAttnCutePeer)  # no torch here: only what inputs() and the cache use
    peer.cp, peer._tensors, peer._tensors_shape = None, {}, None
    peer.configuration, peer.dtype = config.DENSE, "fp16"
    peer.torch = SimpleNamespace(from_dlpack=lambda array: array)
    copies = []
    monkeypatch.setattr(peer, "_as_input", lambda tensor: copies.append(tensor) or f"copy of {tensor.data.ptr}")
    case, long = Shape(1, 64, 1024, 128), Shape(1, 64, 2048, 128)
    sets = [peer.inputs(case, rng=None) for _ in range(3)]
    assert len(copies) == 9  # q, k and v of each set, made with the set
    assert [peer._tensor(q) for q, *_ in sets] == ["copy of 1", "copy of 5", "copy of 9"] and len(copies) == 9
    peer.inputs(long, rng=None)  # another shape drops the last shape's sets
    peer._tensor(sets[0][0])
    assert len(copies) == 13


@pytest.mark.gpu
@pytest.mark.skipif(not HAVE_TORCH, reason="torch is not installed")
@pytest.mark.parametrize("name", [p.name for p in config.load(ROOT / "config.yaml").peers])
def test_each_peer_matches_the_fp32_reference(settings, name):
    """On the kinds of input the pipeline's gate uses: far_max is the kernels' (the GPU tests check
    every kernel on it), and on it PyTorch's math backend lands at plain fp16's own error, 6x the
    tolerance (logits near 1200 stored in fp16)."""
    peer = next(p for p in settings.peers if p.name == name)
    if peer.backend == peers.FLASH_ATTN_CUTE and importlib.util.find_spec("flash_attn") is None:
        pytest.skip("flash-attn-4 is not installed")
    gpu.require()
    impl = peers.make(peer)
    result = check_kernel(impl, [Shape(1, 4, 1024, 128), Shape(2, 3, 384, 128)],
                          Gate(settings.check_factor, settings.tolerance), kinds=settings.check_inputs,
                          progress=lambda m: None)
    assert result["passed"], result["reason"]
    assert impl.identity["backend"] == peer.backend
