"""The Snakemake DAG (dry runs) and the no-GPU behaviour of the command line."""
import re
import shutil
import subprocess
import sys

import pytest

from flashbench import gpu

from conftest import ROOT

pytestmark = pytest.mark.usefixtures("needs_nvcc")


@pytest.fixture
def checkout(tmp_path):
    """A copy of the workflow with no build/, results/ or reports/: what a fresh clone has."""
    for name in ("Snakefile", "config.yaml", "workflow", "kernels"):
        src = ROOT / name
        (shutil.copytree if src.is_dir() else shutil.copy)(src, tmp_path / name)
    (tmp_path / "profiles").symlink_to("workflow/profiles")
    return tmp_path


def snakemake(cwd, *args):
    return subprocess.run([sys.executable, "-m", "snakemake", "--nolock", *args], cwd=cwd,
                          capture_output=True, text=True)


def job_counts(stdout: str) -> dict:
    table = stdout.split("Job stats:")[1].split("total")[0]
    return {m[1]: int(m[2]) for m in re.finditer(r"^(\w+)\s+(\d+)$", table, re.M)}


def test_dry_run_with_a_gpu_lists_every_stage(checkout):
    proc = snakemake(checkout, "-n", "--config", "gpu=nvidia-h200", "gpu_arch=sm_90")
    assert proc.returncode == 0, proc.stderr
    assert job_counts(proc.stdout) == {"compile_kernel": 2, "check_kernel": 1, "bench_kernel": 1,
                                       "summarize": 1, "render_report": 1, "report": 1}
    assert "results/nvidia-h200/bench/v11.json" in proc.stdout
    assert "reports/nvidia-h200/report.md" in proc.stdout


def test_dry_run_adds_the_gpus_own_arch(checkout):
    proc = snakemake(checkout, "-n", "--config", "gpu=nvidia-gh-test", "gpu_arch=sm_100")
    assert proc.returncode == 0, proc.stderr
    assert job_counts(proc.stdout)["compile_kernel"] == 3
    assert "build/sm_100/v11.cubin" in proc.stdout


def test_one_kernel_edit_reruns_only_its_jobs(checkout):
    assert snakemake(checkout, "compile", "--cores", "2").returncode == 0
    (checkout / "kernels" / "v11.cu").write_text((checkout / "kernels" / "v11.cu").read_text() + "\n")
    proc = snakemake(checkout, "-n", "compile")
    here = gpu.detect()
    archs = {"sm_90", "sm_103"} | ({here.arch} if here else set())
    assert job_counts(proc.stdout) == {"compile_kernel": len(archs), "compile": 1}


@pytest.mark.skipif(gpu.detect() is not None, reason="a GPU is here")
def test_without_a_gpu_report_compiles_and_rerenders_the_archive(checkout):
    proc = snakemake(checkout, "-n")
    assert proc.returncode == 0, proc.stderr
    assert job_counts(proc.stdout) == {"compile_kernel": 2, "report": 1}
    assert "no GPU found" in proc.stderr


@pytest.mark.skipif(gpu.detect() is not None, reason="a GPU is here")
@pytest.mark.parametrize("target", ["check", "bench"])
def test_without_a_gpu_a_gpu_stage_fails_at_once(checkout, target):
    proc = snakemake(checkout, target)
    assert proc.returncode != 0
    assert "error: no NVIDIA GPU found" in proc.stdout + proc.stderr
    assert not (checkout / "build").exists()  # nothing compiled first


@pytest.mark.skipif(gpu.detect() is not None, reason="a GPU is here")
def test_gpu_cli_stage_without_a_gpu_is_one_clear_line(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "flashbench", "check", "--cubin", "x", "--record", "y",
                           "--out", str(tmp_path / "o.json"), "--shapes", "[]", "--tolerance", "0.01"],
                          capture_output=True, text=True)
    assert proc.returncode == 1
    assert proc.stderr.strip().startswith("error: no NVIDIA GPU found")
    assert "Traceback" not in proc.stderr and not (tmp_path / "o.json").exists()
