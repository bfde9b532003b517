"""The Snakemake DAG (dry runs) and the no-GPU behaviour of the command line."""
import os
import re
import shutil
import subprocess
import sys
import time

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


def snakemake(cwd, *args, env=None):
    return subprocess.run([sys.executable, "-m", "snakemake", "--nolock", *args], cwd=cwd,
                          capture_output=True, text=True, env=env)


@pytest.fixture
def with_ncu(tmp_path):
    """An environment where an `ncu` is found on PATH (a stub: dry runs never call it)."""
    stub = tmp_path / "bin" / "ncu"
    stub.parent.mkdir()
    stub.write_text("#!/bin/sh\nexit 0\n")
    stub.chmod(0o755)
    return {**os.environ, "PATH": f"{stub.parent}{os.pathsep}{os.environ['PATH']}"}


PROFILING_HERE = shutil.which("ncu") is not None


def job_counts(stdout: str) -> dict:
    table = stdout.split("Job stats:")[1].split("total")[0]
    return {m[1]: int(m[2]) for m in re.finditer(r"^(\w+)\s+(\d+)$", table, re.M)}


H200 = ("--config", "gpu=nvidia-h200", "gpu_arch=sm_90")  # GPU mode on any machine, for dry runs


def builds(settings, archs: int) -> int:
    """Compile jobs: `archs` per kernel built for the global archs, one per own arch for the others."""
    return sum(len(k.archs) if k.archs else archs for k in settings.kernels)


def test_dry_run_with_a_gpu_lists_every_stage(checkout, settings, with_ncu):
    proc = snakemake(checkout, "-n", *H200, env=with_ncu)
    assert proc.returncode == 0, proc.stderr
    n, peers = len(settings.kernels), len(settings.peers)
    assert job_counts(proc.stdout) == {"compile_kernel": builds(settings, 2), "all_built": 1, "check_kernel": n, "bench_kernel": n,
                                       "sweep_kernel": n, "profile_kernel": n, "check_peer": peers, "bench_peer": peers,
                                       "sweep_peer": peers, "summarize": 1, "render_report": 1, "report": 1}


def a_gpu_here(tmp_path, line="NVIDIA H200, 9.0, 00000000:19:00.0"):
    """An environment whose nvidia-smi (a stub) reports one GPU."""
    stub = tmp_path / "smi" / "nvidia-smi"
    stub.parent.mkdir()
    stub.write_text(f"#!/bin/sh\necho '{line}'\n")
    stub.chmod(0o755)
    return {**os.environ, "PATH": f"{stub.parent}{os.pathsep}{os.environ['PATH']}"}


def test_a_configured_gpu_that_is_not_the_one_here_is_an_error_before_any_job(checkout, tmp_path):
    env = a_gpu_here(tmp_path)
    proc = snakemake(checkout, "-n", "--config", "gpu=nvidia-b300", env=env)
    assert proc.returncode != 0
    assert "config key 'gpu': 'nvidia-b300', but the GPU here is NVIDIA H200 (nvidia-h200)" in proc.stdout + proc.stderr
    assert "Job stats" not in proc.stdout
    assert snakemake(checkout, "-n", "--config", "gpu=nvidia-h200", env=env).returncode == 0


def test_every_gpu_job_waits_for_every_build(checkout, settings):
    proc = snakemake(checkout, "-n", "-c1", *H200)
    assert proc.returncode == 0, proc.stderr
    jobs = re.findall(r"^rule (\w+):", proc.stdout, re.M)
    gpu_jobs = [i for i, rule in enumerate(jobs) if rule.startswith(("check_", "bench_", "sweep_", "profile_"))]
    compiles = [i for i, rule in enumerate(jobs) if rule == "compile_kernel"]
    assert len(compiles) == builds(settings, 2) and gpu_jobs and max(compiles) < min(gpu_jobs)


def test_without_ncu_the_profile_is_skipped_and_said_so(checkout, settings, with_ncu):
    without = {**with_ncu, "PATH": with_ncu["PATH"].split(os.pathsep, 1)[1]}
    if shutil.which("ncu", path=without["PATH"]):
        pytest.skip("an ncu is installed here")
    proc = snakemake(checkout, "-n", *H200, env=without)
    assert "profile_kernel" not in job_counts(proc.stdout)
    proc = snakemake(checkout, "profile", *H200, env=without)
    assert proc.returncode == 0 and "profile: skipped: ncu was not found on this machine" in proc.stdout
    # and config `ncu: false` turns it off where ncu is found
    proc = snakemake(checkout, "-n", *H200, "ncu=False", env=with_ncu)
    assert "profile_kernel" not in job_counts(proc.stdout)


def test_dry_run_adds_the_gpus_own_arch(checkout, settings):
    proc = snakemake(checkout, "-n", "--config", "gpu=nvidia-gh-test", "gpu_arch=sm_100")
    assert proc.returncode == 0, proc.stderr
    assert job_counts(proc.stdout)["compile_kernel"] == builds(settings, 3)
    assert "build/sm_100/v11.cubin" in proc.stdout


def test_an_sm_90a_kernel_runs_its_sm_90a_build_on_sm_90_and_is_still_checked_elsewhere(checkout, settings):
    """On an sm_90 GPU the check of an sm_90a-only kernel takes its sm_90a build; on any other GPU it takes
    that build too (its only one), and the check stage records the kernel skipped with the reason."""
    hopper = [k.name for k in settings.kernels if k.archs == ["sm_90a"]]
    assert hopper, "no sm_90a-only kernel in config.yaml"
    for gpu_args in (H200, ("--config", "gpu=nvidia-gh-test", "gpu_arch=sm_103")):
        proc = snakemake(checkout, "-n", "-p", "check", *gpu_args)
        assert proc.returncode == 0, proc.stderr
        for name in hopper:
            assert f"--cubin build/sm_90a/{name}.cubin --record build/sm_90a/{name}.json" in proc.stdout
            assert f"build/sm_90/{name}." not in proc.stdout and f"build/sm_103/{name}." not in proc.stdout


def _archs_here():
    here = gpu.detect()
    return {"sm_90", "sm_103"} | ({here.arch} if here else set())


@pytest.mark.parametrize("source, kernels", [("v11.cu", 1), ("v13.cu", 3)])  # v13.cu builds v13 and both ablations
def test_one_kernel_edit_reruns_only_its_jobs(checkout, source, kernels):
    assert snakemake(checkout, "compile", "--cores", "4").returncode == 0
    (checkout / "kernels" / source).write_text((checkout / "kernels" / source).read_text() + "\n")
    proc = snakemake(checkout, "-n", "compile")
    assert job_counts(proc.stdout) == {"compile_kernel": kernels * len(_archs_here()), "compile": 1}


@pytest.fixture
def measured_checkout(checkout):
    """A checkout with every kernel built and the H200 archive in place, newer than the builds. Kernels
    the archive has no records of (added to config since that run) are left out of `versions`."""
    import yaml

    text = (checkout / "config.yaml").read_text()
    archived = {p.stem for p in (ROOT / "results" / "nvidia-h200" / "check").glob("*.json")}
    versions = [name for name in yaml.safe_load(text)["versions"] if name in archived]
    text = re.sub(r"^versions: \[.*\]$", f"versions: [{', '.join(versions)}]", text, count=1, flags=re.M)
    (checkout / "config.yaml").write_text(text)
    assert snakemake(checkout, "compile", "--cores", "4", *H200).returncode == 0
    now = time.time()
    for age, pattern in enumerate(["results/nvidia-h200/*/*.json", "results/nvidia-h200/*.*", "reports/nvidia-h200/*"]):
        for path in ROOT.glob(pattern):  # in pipeline order: checks and timings, tables, report
            copy = checkout / path.relative_to(ROOT)
            copy.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(path, copy)
            os.utime(copy, (now + age, now + age))
    return checkout


@pytest.mark.parametrize("ablation", ["br128", "hybrid_smem"])
def test_an_ablation_target_reruns_that_ablation_alone(measured_checkout, ablation):
    target = f"ablation_{ablation}"
    assert "Nothing to be done" in snakemake(measured_checkout, "-n", target, *H200).stdout

    # its definition changed: its builds, check and timing rerun, then the report; nothing else
    defines = {"br128": "{BLOCK_ROWS: 128}", "hybrid_smem": "{BLOCK_ROWS: 128, HYBRID_SMEM: 1}"}[ablation]
    config = measured_checkout / "config.yaml"
    assert config.read_text().count(f"defines: {defines}") == 1
    config.write_text(config.read_text().replace(f"defines: {defines}", f"defines: {defines[:-1]}, TRIAL: 1}}"))
    proc = snakemake(measured_checkout, "-n", target, *H200)
    assert proc.returncode == 0, proc.stderr
    profiled = {"profile_kernel": 1} if PROFILING_HERE else {}
    assert job_counts(proc.stdout) == {"compile_kernel": 2, "check_kernel": 1, "bench_kernel": 1, "sweep_kernel": 1,
                                       **profiled, "summarize": 1, "render_report": 1, target: 1}
    assert f"results/nvidia-h200/bench/{ablation}.json" in proc.stdout


def test_an_ablation_is_timed_again_on_request(measured_checkout):
    proc = snakemake(measured_checkout, "-n", "ablation_br128", "-R", "results/nvidia-h200/bench/br128.json", *H200)
    assert job_counts(proc.stdout) == {"bench_kernel": 1, "summarize": 1, "render_report": 1, "ablation_br128": 1}


@pytest.mark.skipif(gpu.detect() is not None, reason="a GPU is here")
def test_without_a_gpu_report_compiles_and_rerenders_the_archive(checkout, settings):
    proc = snakemake(checkout, "-n")
    assert proc.returncode == 0, proc.stderr
    assert job_counts(proc.stdout) == {"compile_kernel": builds(settings, 2), "report": 1}
    assert "no GPU found" in proc.stderr


@pytest.mark.skipif(gpu.detect() is not None, reason="a GPU is here")
@pytest.mark.parametrize("target", ["check", "bench", "sweep", "profile", "ablation_br128"])
def test_without_a_gpu_a_gpu_stage_fails_at_once(checkout, target):
    proc = snakemake(checkout, target)
    assert proc.returncode != 0
    assert "error: no NVIDIA GPU found" in proc.stdout + proc.stderr
    assert not (checkout / "build").exists()  # nothing compiled first


@pytest.mark.skipif(gpu.detect() is not None, reason="a GPU is here")
def test_gpu_cli_stage_without_a_gpu_is_one_clear_line(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "flashbench", "check", "--cubin", "x", "--record", "y",
                           "--out", str(tmp_path / "o.json"), "--shapes", "[]", "--factor", "2", "--tolerance", "0.01"],
                          capture_output=True, text=True)
    assert proc.returncode == 1
    assert proc.stderr.strip().startswith("error: no NVIDIA GPU found")
    assert "Traceback" not in proc.stderr and not (tmp_path / "o.json").exists()


def test_without_a_sweep_in_config_the_rest_still_runs(checkout):
    import yaml

    config = yaml.safe_load((checkout / "config.yaml").read_text())
    del config["sweep"]
    (checkout / "config.yaml").write_text(yaml.safe_dump(config))
    proc = snakemake(checkout, "-n", *H200)
    assert proc.returncode == 0, proc.stderr
    counts = job_counts(proc.stdout)
    assert "sweep_kernel" not in counts and "sweep_peer" not in counts and counts["summarize"] == 1


SLURM_PROFILE = ROOT / "workflow" / "profiles" / "slurm" / "config.yaml"
GPU_RULES = {"check_kernel", "check_peer", "bench_kernel", "bench_peer", "sweep_kernel", "sweep_peer", "profile_kernel"}


def job_resources(stdout: str) -> dict:
    """Each rule of a dry run's jobs, with the resources its jobs print (all its jobs alike)."""
    resources = {}
    for rule, body in re.findall(r"^rule (\w+):\n(.*?)(?=^\S|\Z)", stdout, re.M | re.S):
        printed = re.search(r"^\s+resources: (.*)$", body, re.M)[1]
        resources.setdefault(rule, []).append(dict(item.split("=", 1) for item in printed.split(", ")))
    for rule, jobs in resources.items():
        assert all(job == jobs[0] for job in jobs), f"{rule}'s jobs ask for different resources"
    return {rule: jobs[0] for rule, jobs in resources.items()}


def test_the_slurm_profile_asks_one_gpu_of_one_kind_for_the_gpu_stages_alone(checkout, with_ncu):
    """A head node with no GPU: --config names the GPU, and only the GPU stages ask SLURM for one."""
    proc = snakemake(checkout, "-n", "--workflow-profile", "workflow/profiles/slurm", *H200, env=with_ncu)
    assert proc.returncode == 0, proc.stderr
    assert "profiles/slurm" in proc.stderr
    resources = job_resources(proc.stdout)
    asking_a_gpu = {rule for rule, r in resources.items() if "gpu" in r or "gpu_model" in r or "gres" in r}
    assert asking_a_gpu == GPU_RULES
    for rule in GPU_RULES:
        assert (resources[rule]["gpu"], resources[rule]["gpu_model"]) == ("1", "h200"), rule
        assert resources[rule]["slurm_partition"] == "gpu"
    for rule in ("compile_kernel", "summarize", "render_report"):
        assert resources[rule]["slurm_partition"] == "cpu"

    import yaml

    profile = yaml.safe_load(SLURM_PROFILE.read_text())
    assert profile["executor"] == "slurm"
    assert set(profile["set-resources"]) == GPU_RULES  # every entry names a GPU rule: no typo goes unnoticed
