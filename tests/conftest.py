import contextlib
import fcntl
import functools
import importlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace

# One BLAS thread in each test worker (pytest -n): the workers keep every core busy already, and
# OpenBLAS's own threads would spin waiting for work on cores the other workers need. OpenBLAS reads
# it as NumPy loads, so before the imports below.
if "PYTEST_XDIST_WORKER" in os.environ:
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import pytest  # noqa: E402

from flashbench import config, gpu  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def pytest_collection_modifyitems(config, items):
    if gpu.detect() is None:
        skip = pytest.mark.skip(reason="no NVIDIA GPU found")
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(skip)
    items.sort(key=_build_first_and_last)


def _build_first_and_last(item) -> int:
    """Where a test goes in the run, which pytest -n splits among its workers in this order.
    test_compile's tests that read the session's build (built) come first: the first worker starts
    the build at once, then reads it, while the others run the tests that need no build. The other
    tests that read the build come last, when it is done: no worker waits for it."""
    if "built" not in item.fixturenames:
        return 1
    return 0 if item.module.__name__ == "test_compile" else 2


@functools.cache
def shipped_settings() -> config.Settings:
    """config.yaml as the pipeline reads it, read once per process."""
    return config.load(ROOT / "config.yaml")


@pytest.fixture(scope="session")
def settings():
    return shipped_settings()


@pytest.fixture(scope="session")
def settings_file(tmp_path_factory):
    """config.yaml as the workflow hands it to every command: its settings file (config.write_settings).
    A command finds the kernels' sources from the repository root."""
    return str(config.write_settings(config.read(ROOT / "config.yaml"), tmp_path_factory.mktemp("settings")))


@pytest.fixture
def records_settings(monkeypatch):
    """`--settings` for a command run over the synthetic records (tests/records.py): their run's settings."""
    import records
    from flashbench import cli

    monkeypatch.setattr(cli, "load_settings", lambda path: records.settings())
    return ["--settings", "records.json"]


@pytest.fixture(scope="session")
def needs_nvcc():
    if shutil.which("nvcc") is None:
        pytest.skip("nvcc not found")


def copy_checkout(dest: Path) -> Path:
    """A copy of the workflow alone, no build/, results/ or reports/. File times are kept, so the
    sources stay older than anything built from them."""
    for name in ("Snakefile", "config.yaml", "workflow", "kernels"):
        src = ROOT / name
        (shutil.copytree if src.is_dir() else shutil.copy2)(src, dest / name)
    (dest / "profiles").symlink_to("workflow/profiles")
    return dest


@functools.cache
def _snakemake_cli():
    """Snakemake's command line, imported once for the session by the process that runs the tests (not
    by the pytest -n controller, which runs none). With it, what Snakemake imports only once a run
    needs it (remote-file and storage layers, YAML templating, the HTML report) and its plugin
    registries, which it fills as it builds its command line: every fork (snakemake() below) starts
    with them all rather than paying for them again (the import takes longer than a dry run, the
    rest a third of one)."""
    import snakemake.cli

    for module in ("smart_open", "yte", "platformdirs", "snakemake.storage", "snakemake.report.html_reporter",
                   "jsonschema", "flashbench.schemas", "flashbench.archives", "flashbench.codegraph", "flashbench.compile",
                   "flashbench.files", "flashbench.peers"):
        importlib.import_module(module)
    snakemake.cli.get_argument_parser()
    return snakemake.cli


@functools.cache
def _commands() -> list[str]:
    from flashbench import cli

    return list(next(a for a in cli.parser()._actions if a.dest == "command").choices)


def _read_import_graph() -> None:
    """codegraph.command_modules of every command, in the process that forks Snakemake (snakemake()
    below): codegraph keeps them for the process, so every fork starts with them, where the Snakefile
    asks for each rule's code inputs (the installed package's source, the same files in every checkout)."""
    from flashbench import codegraph

    for command in _commands():
        codegraph.command_modules(command)


def with_stub(tmp_path: Path, name: str, script: str) -> dict:
    """An environment whose PATH finds `name` first: a shell stub running `script`."""
    stub = tmp_path / f"{name}-stub" / name
    stub.parent.mkdir()
    stub.write_text(f"#!/bin/sh\n{script}\n")
    stub.chmod(0o755)
    return {**os.environ, "PATH": f"{stub.parent}{os.pathsep}{os.environ['PATH']}"}


# What the GPU commands ask of CuPy once they hold the GPU (a test without one puts it in sys.modules)
FAKE_CUPY = SimpleNamespace(cuda=SimpleNamespace(Device=lambda *a: SimpleNamespace(pci_bus_id="0000:19:00.0",
                                                                                    synchronize=lambda: None),
                                                 runtime=SimpleNamespace(deviceSynchronize=lambda: None)),
                            random=SimpleNamespace(default_rng=lambda seed: seed))


def recording_hold(steps: list):
    """A stand-in for cli._gpu_held that notes each hold, ("hold", what), and its release in `steps`."""
    @contextlib.contextmanager
    def held(what, exclusive=True):
        steps.append(("hold", what))
        yield
        steps.append(("release", what))

    return held


def the_parent_never_holds(what, exclusive=True):
    """A stand-in for cli._gpu_held in a stage whose driver, not itself, holds the GPU."""
    raise AssertionError(f"the parent took the GPU's lock for {what}")


def a_gpu_here(tmp_path: Path, line: str = "NVIDIA H200, 9.0, 00000000:19:00.0") -> dict:
    """An environment whose nvidia-smi (a stub) reports one GPU."""
    return with_stub(tmp_path, "nvidia-smi", f"echo '{line}'")


def snakemake(cwd, *args, env=None) -> subprocess.CompletedProcess:
    """`python -m snakemake --nolock ARGS` in `cwd`: Snakemake's own command line, run in a fork of
    this process, which has imported Snakemake once for the session (_snakemake_cli). The fork's
    output, and its jobs', goes to its own stdout and stderr, as in a subprocess; `env` is its
    environment, $PYTHONPATH on its path as a new interpreter would have it."""
    argv = ["snakemake", "--nolock", *map(str, args)]
    cli = _snakemake_cli()
    _read_import_graph()
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                os.chdir(cwd)
                if env is not None:
                    os.environ.clear()
                    os.environ.update(env)
                    # where a new interpreter puts $PYTHONPATH: first on its path (importlib.metadata too)
                    sys.path[:0] = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
                os.dup2(out.fileno(), 1)
                os.dup2(err.fileno(), 2)
                sys.stdout, sys.stderr = open(1, "w", closefd=False), open(2, "w", closefd=False)
                shell = importlib.import_module("snakemake.shell")  # the module: the package's `shell` is its class
                shell.STDOUT = sys.stdout  # what it binds on import: its jobs' stdout
                sys.argv = argv
                cli.main(argv[1:])
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else int(e.code is not None)
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        out.seek(0)
        err.seek(0)
        return subprocess.CompletedProcess(argv, os.waitstatus_to_exitcode(status), out.read().decode(),
                                           err.read().decode())


@pytest.fixture(scope="session")
def built(tmp_path_factory, worker_id, needs_nvcc):
    """A checkout where the pipeline's compile stage has built every kernel, once per test run: copy
    its build/ and .snakemake/metadata (see with_build) rather than compiling again. The test workers
    (pytest -n) share it: the first builds it, the others wait on a lock and take it."""
    base = tmp_path_factory.getbasetemp()
    root = (base if worker_id == "master" else base.parent) / "built"
    with open(f"{root}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (root / "build" / "all-built").exists():
            shutil.rmtree(root, ignore_errors=True)
            root.mkdir()
            proc = snakemake(copy_checkout(root), "compile")
            assert proc.returncode == 0, proc.stderr
    return root


def made_once(tmp_path_factory, worker_id, name: str, make) -> Path:
    """A folder of the test run's that `make(folder)` fills once, for every test worker (pytest -n), as
    `built` is made: the first worker to ask makes it, the others wait on a lock and take it as it is.
    For what the tests only read (or copy before they change it)."""
    base = tmp_path_factory.getbasetemp()
    root = (base if worker_id == "master" else base.parent) / name
    with open(f"{root}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        done = root.with_name(f"{name}.done")
        if not done.exists():
            shutil.rmtree(root, ignore_errors=True)
            root.mkdir()
            make(root)
            done.touch()
    return root


def with_build(checkout: Path, built: Path) -> Path:
    """`checkout` with the session's build/ and Snakemake's records of it, file times kept: its
    compile jobs are up to date, as if it had compiled them itself."""
    shutil.copytree(built / "build", checkout / "build")
    shutil.copytree(built / ".snakemake" / "metadata", checkout / ".snakemake" / "metadata")
    return checkout


@pytest.fixture(scope="session")
def gpu_held():
    """The GPU's lock for the whole test session: no pipeline run times beside the GPU tests."""
    import cupy as cp

    from flashbench import gpulock

    with gpulock.hold(cp.cuda.Device().pci_bus_id, "GPU tests"):
        yield


@pytest.fixture(autouse=True)
def _hold_the_gpu_in_gpu_tests(request):
    if request.node.get_closest_marker("gpu"):
        request.getfixturevalue("gpu_held")
