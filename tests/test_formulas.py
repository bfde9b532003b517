import numpy as np
import pytest

from flashbench import attention
from flashbench.config import Shape

from conftest import ROOT

CASE = Shape(1, 64, 1024, 128)


def test_flops_of_the_case_match_the_write_up():
    assert attention.flops(CASE) == 4 * 64 * 1024**2 * 128
    assert attention.flops(CASE) / 1e9 == pytest.approx(34.36, abs=0.01)


@pytest.mark.parametrize("total_s, published", [(0.0157, 219.15), (0.0151, 226.83), (0.0173, 198.96)])
def test_tflops_from_the_write_ups_100_step_totals(total_s, published):
    # the write-up printed its totals rounded to 0.1 ms, so its TFLOPS agree to within that rounding
    assert attention.tflops(CASE, total_s / 100) == pytest.approx(published, rel=0.005)


def test_memory_throughput_counts_q_k_v_and_o():
    assert attention.qkvo_bytes(CASE) == 4 * 64 * 1024 * 128 * 2
    assert attention.gib_per_s(CASE, 1.0) == pytest.approx(64 / 1024)
    assert attention.input_bytes(CASE) == 48 * 2**20


def test_causal_flops_are_half():
    assert attention.flops(CASE, causal=True) * 2 == attention.flops(CASE)
    assert attention.tflops(CASE, 1.0, causal=True) * 2 == attention.tflops(CASE, 1.0)


def _naive(q, k, v, causal=False):
    out = np.zeros(q.shape)
    S = q.shape[2]
    for b in range(q.shape[0]):
        for h in range(q.shape[1]):
            s = q[b, h].astype(np.float64) @ k[b, h].astype(np.float64).T / np.sqrt(128)
            if causal:  # query i sees keys 0..i only
                s[np.triu_indices(S, 1)] = -np.inf
            p = np.exp(s - s.max(axis=1, keepdims=True))
            out[b, h] = (p / p.sum(axis=1, keepdims=True)) @ v[b, h]
    return out


def test_reference_matches_a_float64_softmax_attention():
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((2, 3, 40, 128)).astype(np.float16) for _ in range(3))
    ref = attention.reference(q, k, v, np, max_logit_bytes=40 * 40 * 4 * 2)  # forces chunking over heads
    err = attention.errors(ref, _naive(q, k, v), np)
    assert err["rel_error"] < 1e-6 and err["nonfinite"] == 0


def test_the_causal_reference_sees_each_querys_keys_up_to_its_own():
    rng = np.random.default_rng(1)
    q, k, v = (rng.standard_normal((1, 2, 37, 128)).astype(np.float16) for _ in range(3))
    ref = attention.reference(q, k, v, np, causal=True, max_logit_bytes=37 * 37 * 4)
    assert attention.errors(ref, _naive(q, k, v, causal=True), np)["rel_error"] < 1e-6
    assert np.allclose(ref[:, :, 0], v[:, :, 0].astype(np.float32))  # the first query sees its own key alone
    yardstick = attention.plain_code(q, k, v, np, causal=True)
    assert attention.errors(yardstick, ref, np)["rel_error"] < 5e-3
    assert attention.errors(attention.reference(q, k, v, np), ref, np)["rel_error"] > 0.1  # the mask matters


def test_errors_fail_nan_and_measure_relative_error():
    ref = np.ones((1, 1, 4, 128), dtype=np.float32)
    assert attention.errors(ref * 1.01, ref, np)["rel_error"] == pytest.approx(0.01, rel=1e-4)
    poisoned = ref.copy()
    poisoned[0, 0, 2, 5] = np.nan
    err = attention.errors(poisoned, ref, np)
    assert err["nonfinite"] == 1 and np.isnan(err["rel_error"])


def test_gits_own_commit_wins_and_a_differing_given_one_is_recorded_beside_it(monkeypatch, tmp_path):
    from flashbench.gpu import _git_head, git_commit

    head = _git_head(ROOT)
    if head is None:
        pytest.skip("this checkout has no working git")
    monkeypatch.setenv("FLASHBENCH_GIT_COMMIT", "52e5b6c")
    assert git_commit(ROOT) == {"git_commit": head, "given_commit": "52e5b6c"}
    monkeypatch.setenv("FLASHBENCH_GIT_COMMIT", head[:12])  # the same commit, given: nothing beside it
    assert git_commit(ROOT) == {"git_commit": head}
    assert git_commit(tmp_path) == {"git_commit": f"{head[:12]} (given: no git here)"}  # no git there: the given one
    monkeypatch.delenv("FLASHBENCH_GIT_COMMIT")
    assert git_commit(tmp_path)["git_commit"].startswith("unknown")
    assert len(git_commit(ROOT)["git_commit"].split("+")[0]) == 40


def test_a_checkout_is_dirty_for_changed_code_not_for_an_archive_cleared_to_run_afresh(tmp_path):
    import subprocess

    from flashbench.gpu import _git_head

    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]
    for path in ("kernels/v11.cu", "results/nvidia-h200/summary.csv", "reports/nvidia-h200/report.md"):
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text("x\n")
    try:
        subprocess.run([*git, "init", "-q"], cwd=tmp_path, check=True)
        subprocess.run([*git, "add", "."], cwd=tmp_path, check=True)
        subprocess.run([*git, "commit", "-qm", "c"], cwd=tmp_path, check=True)
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("no working git here")
    (tmp_path / "results/nvidia-h200/summary.csv").unlink()
    (tmp_path / "reports/nvidia-h200/report.md").write_text("y\n")
    assert not _git_head(tmp_path).endswith("+dirty")
    (tmp_path / "kernels/v11.cu").write_text("y\n")
    assert _git_head(tmp_path).endswith("+dirty")
