"""The wheelhouse for GPU hosts without internet: platform tags, pip command lines, the order of the
build, its errors, and an offline install from a folder of wheels."""
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from flashbench import FlashbenchError, cli, wheelhouse

from conftest import ROOT


def test_a_manylinux_platform_takes_every_older_glibc_down_to_manylinux1():
    tags = wheelhouse.compatible_platforms("manylinux_2_28_x86_64")
    assert tags[:2] == ["manylinux_2_28_x86_64", "manylinux_2_27_x86_64"]
    assert tags[-2:] == ["manylinux_2_5_x86_64", "manylinux1_x86_64"]
    for alias, glibc in (("manylinux2014", "manylinux_2_17"), ("manylinux2010", "manylinux_2_12")):
        assert tags.index(f"{alias}_x86_64") == tags.index(f"{glibc}_x86_64") + 1
    assert len(tags) == len(set(tags)) == (28 - 5 + 1) + 3


def test_other_architectures_stop_at_manylinux2014_and_aliases_expand_like_their_glibc():
    assert wheelhouse.compatible_platforms("manylinux_2_18_aarch64") == [
        "manylinux_2_18_aarch64", "manylinux_2_17_aarch64", "manylinux2014_aarch64"]
    assert (wheelhouse.compatible_platforms("manylinux2014_x86_64")
            == wheelhouse.compatible_platforms("manylinux_2_17_x86_64"))
    assert wheelhouse.compatible_platforms("win_amd64") == ["win_amd64"]


@pytest.mark.parametrize("platform", ["manylinux 2_28", "", "manylinux_3_1_x86_64"])
def test_a_bad_platform_is_refused(platform):
    with pytest.raises(FlashbenchError, match="--platform"):
        wheelhouse.compatible_platforms(platform)


def test_the_python_version_is_checked_against_requires_python():
    project = wheelhouse.read_project(ROOT)
    assert wheelhouse.check_python("3.12", project) == "3.12"
    for bad, message in (("3.10", "needs Python >=3.11"), ("312", "major.minor"), ("3.12.1", "major.minor")):
        with pytest.raises(FlashbenchError, match=message):
            wheelhouse.check_python(bad, project)


def test_the_project_is_read_from_its_pyproject():
    project = wheelhouse.read_project(ROOT)
    assert (project.name, project.build_requires) == ("flashbench", ["setuptools>=68"])
    assert project.packages == [Path("workflow/flashbench")]
    assert {"test", "slurm"} <= set(project.extras)


def test_pip_command_lines():
    folder = Path("/wh")
    download = wheelhouse.download_command(folder, "3.12", ["manylinux_2_28_x86_64", "manylinux2014_x86_64"],
                                           ["/wh/flashbench-0.1.0-py3-none-any.whl[test]", "setuptools>=68"])
    assert download[:4] == [sys.executable, "-m", "pip", "download"]
    text = " ".join(download)
    for part in ("--only-binary=:all:", "--python-version 3.12", "--implementation cp",
                 "--platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64", "--find-links /wh", "--dest /wh"):
        assert part in text
    assert download[-2:] == ["/wh/flashbench-0.1.0-py3-none-any.whl[test]", "setuptools>=68"]

    assert wheelhouse.sdist_wheel_command("connection_pool==0.0.3", folder)[3:] == [
        "wheel", "--no-deps", "--no-binary=:all:", "--wheel-dir", "/wh", "connection_pool==0.0.3"]
    assert wheelhouse.project_wheel_command(Path("/src"), folder)[3:] == ["wheel", "--no-deps", "--wheel-dir", "/wh", "/src"]
    assert wheelhouse.install_command(folder, "-e", ".") == [
        "python3", "-m", "pip", "install", "--no-index", "--find-links", "/wh", "-e", "."]


class FakePip:
    """subprocess.run standing in for pip: records each command, writes the wheel `pip wheel` of the
    project would, and fails the pip subcommand named `failing`."""

    def __init__(self, failing=None):
        self.commands, self.failing = [], failing

    def __call__(self, command):
        self.commands.append(command)
        if command[3] == "wheel" and command[-1] not in wheelhouse.SDIST_ONLY:
            assert (Path(command[-1]) / "pyproject.toml").exists()
            folder = Path(command[command.index("--wheel-dir") + 1])
            (folder / "flashbench-0.1.0-py3-none-any.whl").write_bytes(b"")
        return subprocess.CompletedProcess(command, 1 if command[3] == self.failing else 0)


@pytest.fixture
def fake_pip(monkeypatch):
    pip = FakePip()
    monkeypatch.setattr(wheelhouse.subprocess, "run", pip)
    return pip


def test_build_makes_the_projects_wheel_then_the_sdist_only_ones_then_downloads(fake_pip, tmp_path):
    wheelhouse.build(tmp_path / "wh", "3.12", "manylinux_2_28_x86_64", ["test"], ROOT)
    project_wheel, sdist, download = (c[3:] for c in fake_pip.commands)
    assert project_wheel[:4] == ["wheel", "--no-deps", "--wheel-dir", str(tmp_path / "wh")]
    assert Path(project_wheel[-1]) != ROOT  # built from a copy: setuptools' build/ stays out of the checkout
    assert sdist[-1] == "connection_pool==0.0.3"
    assert download[0] == "download"
    assert download[-2:] == [f"{tmp_path / 'wh' / 'flashbench-0.1.0-py3-none-any.whl'}[test]", "setuptools>=68"]
    assert not (ROOT / "build" / "lib").exists()


@pytest.mark.parametrize("failing", ["wheel", "download"])
def test_a_pip_failure_is_one_error_line(fake_pip, tmp_path, capsys, failing):
    fake_pip.failing = failing
    code = cli.main(["wheelhouse", "--python", "3.12", "--platform", "manylinux_2_28_x86_64",
                     "--project", str(ROOT), str(tmp_path / "wh")])
    assert code == 1
    err = capsys.readouterr().err.strip()
    assert err == f"error: pip {failing} failed (exit 1): see pip's message above"


@pytest.mark.parametrize("args, message", [
    (["--python", "3.9", "--platform", "manylinux_2_28_x86_64"], "error: --python 3.9: flashbench needs Python >=3.11"),
    (["--python", "3.12", "--platform", "manylinux_2_28_x86_64", "--extra", "gpu"],
     "error: --extra gpu: flashbench has the extras"),
    (["--python", "3.12", "--platform", "many linux"], "error: --platform 'many linux': give a wheel platform tag"),
])
def test_bad_arguments_are_one_error_line_before_pip_runs(fake_pip, tmp_path, capsys, args, message):
    assert cli.main(["wheelhouse", *args, "--project", str(ROOT), str(tmp_path / "wh")]) == 1
    assert capsys.readouterr().err.strip().startswith(message)
    assert fake_pip.commands == []


def test_outside_a_checkout_the_error_says_where_to_run(fake_pip, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert cli.main(["wheelhouse", "--python", "3.12", "--platform", "manylinux_2_28_x86_64", "wh"]) == 1
    assert capsys.readouterr().err.strip() == ("error: pyproject.toml not found: run from the repository root "
                                               "or give it with --project")


def _offline_env():
    """pip with no index and no configured find-links: what a host without internet has."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    return {**env, "PIP_CONFIG_FILE": os.devnull, "PIP_NO_INDEX": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}


def test_the_project_installs_from_a_wheelhouse_with_no_index(tmp_path):
    project = wheelhouse.read_project(ROOT)
    source, folder, target = tmp_path / "src", tmp_path / "wh", tmp_path / "site"
    source.mkdir()
    build = [*wheelhouse.project_wheel_command(wheelhouse.copy_wheel_sources(project, source), folder),
             "--no-build-isolation"]
    assert subprocess.run(build, env=_offline_env(), capture_output=True).returncode == 0
    install = [*wheelhouse.install_command(folder, "flashbench", python=sys.executable), "--no-deps", "--target", str(target)]
    proc = subprocess.run(install, env=_offline_env(), capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    imported = subprocess.run([sys.executable, "-c", "import flashbench.wheelhouse, flashbench; print(flashbench.__file__)"],
                              env={**_offline_env(), "PYTHONPATH": str(target)}, cwd=tmp_path,
                              capture_output=True, text=True)
    assert imported.returncode == 0, imported.stderr
    assert Path(imported.stdout.strip()).is_relative_to(target)


@pytest.fixture
def pypi():
    """Skips the test where PyPI cannot be reached (asked when the test runs, not at collection)."""
    try:
        socket.create_connection(("pypi.org", 443), timeout=3).close()
    except OSError as e:
        pytest.skip(f"PyPI is not reachable from here ({e})")


def test_sdist_only_and_older_manylinux_wheels_are_fetched_for_another_python(pypi, tmp_path):
    """The two traps, against PyPI: connection_pool has no wheel, and immutables 0.21's wheels carry
    only manylinux tags up to 2_17, which pip takes for a manylinux_2_28 host only when named."""
    env = {k: v for k, v in os.environ.items() if k != "PIP_FIND_LINKS"}
    env.update(PIP_CONFIG_FILE=os.devnull, PIP_DEFAULT_TIMEOUT="10")
    for requirement in wheelhouse.SDIST_ONLY:
        command = wheelhouse.sdist_wheel_command(requirement, tmp_path)
        assert subprocess.run(command, env=env, capture_output=True, timeout=120).returncode == 0

    def download(platforms):
        command = wheelhouse.download_command(tmp_path, "3.12", platforms, ["immutables==0.21"])
        return subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)

    assert download(["manylinux_2_28_x86_64"]).returncode != 0
    proc = download(wheelhouse.compatible_platforms("manylinux_2_28_x86_64"))
    assert proc.returncode == 0, proc.stderr
    names = sorted(p.name for p in tmp_path.glob("*.whl"))
    assert names[0] == "connection_pool-0.0.3-py3-none-any.whl"
    assert names[1].startswith("immutables-0.21-cp312-cp312-manylinux")
