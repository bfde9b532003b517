"""A wheelhouse for a GPU host without internet: every wheel the pipeline needs, for a named Python
version and platform, so that the host installs from that folder alone.

    python -m flashbench wheelhouse --python 3.12 --platform manylinux_2_28_x86_64 DIR   (with internet)
    python3 -m pip install --no-index --find-links DIR -e .                              (on the host)

The folder holds the project's own wheel, its dependencies as pinned in pyproject.toml with theirs
(pip resolves them from the project wheel's metadata, for the target rather than for this
machine), any optional extras asked for, and the build requirement (setuptools), so that an
editable install of the checkout builds offline too.
"""
from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from packaging.specifiers import SpecifierSet

from . import FlashbenchError

# Dependencies published only as a source distribution, which `pip download --only-binary=:all:`
# cannot fetch: their pure-Python wheels are built here. snakemake needs connection_pool>=0.0.3.
SDIST_ONLY = ("connection_pool==0.0.3",)

# PEP 600: the older manylinux names are aliases of these glibc versions.
LEGACY_MANYLINUX = {"manylinux2014": (2, 17), "manylinux2010": (2, 12), "manylinux1": (2, 5)}
# The oldest glibc a manylinux wheel targets: 2.5 (manylinux1) on x86, 2.17 (manylinux2014) elsewhere.
OLDEST_GLIBC_MINOR = {"x86_64": 5, "i686": 5}
DEFAULT_OLDEST_GLIBC_MINOR = 17


@dataclass(frozen=True)
class Project:
    root: Path
    name: str
    version: str
    requires_python: str
    build_requires: list[str]
    extras: list[str]
    packages: list[Path]  # the package folders the wheel is made of, relative to root


def read_project(root: Path | str) -> Project:
    """The project in `root`, from its pyproject.toml."""
    root = Path(root)
    pyproject = root / "pyproject.toml"
    try:
        meta = tomllib.loads(pyproject.read_text())
    except FileNotFoundError:
        raise FlashbenchError(f"{pyproject} not found: run from the repository root "
                              "or give it with --project") from None
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
        raise FlashbenchError(f"{pyproject}: cannot be read as TOML ({e})") from None
    try:
        project, setuptools = meta["project"], meta["tool"]["setuptools"]
        package_root = Path(setuptools.get("package-dir", {}).get("", "."))
        return Project(root, project["name"], project["version"], project["requires-python"],
                       meta["build-system"]["requires"], sorted(project.get("optional-dependencies", {})),
                       [package_root / name.replace(".", "/") for name in setuptools["packages"]])
    except KeyError as e:
        raise FlashbenchError(f"{pyproject} has no {e.args[0]!r}: not this project's (a setuptools project with "
                              "a name, version, requires-python, build requirements and packages); give the "
                              "repository root with --project") from None


def copy_wheel_sources(project: Project, dest: Path) -> Path:
    """What the project's wheel is built from (pyproject.toml and its packages), copied into `dest`:
    pip builds in the source tree, and setuptools' build/ folder would land in the pipeline's own."""
    shutil.copy(project.root / "pyproject.toml", dest / "pyproject.toml")
    for package in project.packages:
        shutil.copytree(project.root / package, dest / package, ignore=shutil.ignore_patterns("__pycache__"))
    return dest


def check_python(version: str, project: Project) -> str:
    """`version` as pip's --python-version takes it (major.minor), if the project supports it."""
    if not re.fullmatch(r"3\.\d+", version):
        raise FlashbenchError(f"--python {version!r}: give a CPython version as major.minor, e.g. 3.12")
    if version not in SpecifierSet(project.requires_python):
        raise FlashbenchError(f"--python {version}: {project.name} needs Python {project.requires_python}")
    return version


def compatible_platforms(platform: str) -> list[str]:
    """Every platform tag a host of `platform` installs, newest first. pip download matches tags
    exactly, so a manylinux_2_28_x86_64 host must also name 2_27, ..., 2_17 (and its alias
    manylinux2014), ... to get wheels built for an older glibc. Other tags (win_amd64, ...) are
    taken as given."""
    if not re.fullmatch(r"[a-z0-9_]+", platform):
        raise FlashbenchError(f"--platform {platform!r}: give a wheel platform tag, e.g. manylinux_2_28_x86_64")
    match = re.fullmatch(r"manylinux_(\d+)_(\d+)_(\w+)", platform)
    legacy = re.fullmatch(r"(manylinux(?:2014|2010|1))_(\w+)", platform)
    if match:
        (major, minor), arch = (int(match[1]), int(match[2])), match[3]
    elif legacy:
        (major, minor), arch = LEGACY_MANYLINUX[legacy[1]], legacy[2]
    else:
        return [platform]
    if major != 2:
        raise FlashbenchError(f"--platform {platform}: only glibc 2 manylinux tags are known")
    aliases = {version: name for name, version in LEGACY_MANYLINUX.items()}
    tags = []
    for m in range(minor, OLDEST_GLIBC_MINOR.get(arch, DEFAULT_OLDEST_GLIBC_MINOR) - 1, -1):
        tags.append(f"manylinux_2_{m}_{arch}")
        if (2, m) in aliases:
            tags.append(f"{aliases[(2, m)]}_{arch}")
    return tags


def pip(*args: str) -> list[str]:
    return [sys.executable, "-m", "pip", *args]


def project_wheel_command(source: Path, folder: Path) -> list[str]:
    return pip("wheel", "--no-deps", "--wheel-dir", str(folder), str(source))


def sdist_wheel_command(requirement: str, folder: Path) -> list[str]:
    """Download `requirement`'s source distribution and build its wheel into `folder`."""
    return pip("wheel", "--no-deps", "--no-binary=:all:", "--wheel-dir", str(folder), requirement)


def download_command(folder: Path, python: str, platforms: list[str], requirements: list[str]) -> list[str]:
    """Binary wheels of `requirements` and all they depend on, for CPython `python` on any of
    `platforms`; wheels already in `folder` (the ones built here) count as found."""
    platform_args = [arg for tag in platforms for arg in ("--platform", tag)]
    return pip("download", "--only-binary=:all:", "--python-version", python, "--implementation", "cp",
               *platform_args, "--find-links", str(folder), "--dest", str(folder), *requirements)


def install_command(folder: Path | str, *requirement: str, python: str = "python3") -> list[str]:
    """What the host runs: pip install from the wheelhouse alone, e.g. `-e .` (the checkout) or
    `flashbench` (the project's wheel)."""
    return [python, "-m", "pip", "install", "--no-index", "--find-links", str(folder), *requirement]


def _run(command: list[str]) -> None:
    print("+ " + shlex.join(command), flush=True)
    result = subprocess.run(command)
    if result.returncode != 0:
        raise FlashbenchError(f"{' '.join(command[2:4])} failed (exit {result.returncode}): see pip's message above")


def build(folder: Path | str, python: str, platform: str, extras: Sequence[str] = (),
          root: Path | str = ".") -> list[Path]:
    """Fill `folder` with every wheel a CPython `python` host on `platform` needs to install the
    project (with `extras`) offline; returns the wheels."""
    project = read_project(root)
    python = check_python(python, project)
    platforms = compatible_platforms(platform)
    unknown = sorted(set(extras) - set(project.extras))
    if unknown:
        raise FlashbenchError(f"--extra {', '.join(unknown)}: {project.name} has the extras {', '.join(project.extras)}")
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)

    with tempfile.TemporaryDirectory() as source:
        _run(project_wheel_command(copy_wheel_sources(project, Path(source)), folder))
    own_wheel = folder / f"{project.name}-{project.version}-py3-none-any.whl"
    if not own_wheel.exists():
        raise FlashbenchError(f"pip wheel did not write {own_wheel}")
    for requirement in SDIST_ONLY:
        _run(sdist_wheel_command(requirement, folder))
    wanted = f"{own_wheel}[{','.join(extras)}]" if extras else str(own_wheel)
    _run(download_command(folder, python, platforms, [wanted, *project.build_requires]))
    return sorted(folder.glob("*.whl"))
