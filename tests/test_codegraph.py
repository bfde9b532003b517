"""A rule's code inputs are the files its command runs, read from the import graph (codegraph)."""
import os
import re
import shutil
import subprocess
import sys

import pytest

from flashbench import codegraph

from conftest import ROOT, copy_checkout, snakemake, with_build, with_stub

H200 = ("--config", "gpu=nvidia-h200", "gpu_arch=sm_90")
PACKAGE = "workflow/flashbench"


def jobs(stdout: str) -> list[tuple[str, set[str], str]]:
    """Each job of a dry run (-n -p): its rule, its inputs and its shell command."""
    found = []
    for block in re.split(r"\n(?=(?:local)?(?:rule|checkpoint) \w+:)", stdout):
        rule = re.match(r"(?:local)?(?:rule|checkpoint) (\w+):", block)
        command = re.search(r"^Shell command: (.*)$", block, re.M) or re.search(r"^\s{4}(\S.*flashbench.*)$", block, re.M)
        inputs = re.search(r"^\s+input: (.*)$", block, re.M)
        if rule and command and inputs:
            found.append((rule[1], set(inputs[1].split(", ")), command[1]))
    return found


def test_each_rules_code_inputs_are_the_files_its_command_runs(tmp_path, built):
    """Every job of a full dry run on a GPU (Nsight Compute found too; every kernel built, so that the jobs
    after the compile checkpoint show their inputs) lists as code exactly the package's files its
    `python -m flashbench <command>` runs: editing one reruns the jobs that use it, and no other."""
    env = with_stub(tmp_path, "ncu", "exit 0")
    (tmp_path / "checkout").mkdir()
    checkout = with_build(copy_checkout(tmp_path / "checkout"), built)
    proc = snakemake(checkout, "-n", "-p", *H200, env=env)
    compiles = snakemake(checkout, "-n", "-p", "-R", "compile_kernel", "compile")  # built: compiles forced
    assert proc.returncode == 0 and compiles.returncode == 0, proc.stderr + compiles.stderr
    commands, files = {}, {}  # files: each command's, from the graph once (each job of a rule asks the same)
    for rule, inputs, command in jobs(proc.stdout) + jobs(compiles.stdout):
        name = re.search(r"-m flashbench ([a-z-]+)", command)
        if not name:
            continue
        code = {path for path in inputs if path.startswith(PACKAGE + "/")}
        if name[1] not in files:
            files[name[1]] = set(codegraph.command_files(name[1]))
        assert code == files[name[1]], rule
        commands.setdefault(name[1], set()).add(rule)
    assert set(commands) == {"compile", "check", "bench", "sweep", "profile", "head-to-head", "cycles", "summarize",
                             "render", "compare", "pages"}, commands


def test_the_graph_follows_function_level_imports_and_the_commands_a_command_starts():
    # cli imports timing inside cmd_bench alone; profile starts `launch-once` under ncu, which runs launch
    assert "timing" in codegraph.command_modules("bench") and "timing" not in codegraph.command_modules("pages")
    assert "launch" in codegraph.command_modules("profile")
    assert "clocks" in codegraph.command_modules("bench")  # started as `python -m flashbench.clocks`
    assert {"__init__", "__main__", "cli"} <= codegraph.command_modules("pages")
    with pytest.raises(KeyError, match="no command 'nope'"):
        codegraph.command_modules("nope")


def test_an_import_planted_in_a_command_is_found(tmp_path, monkeypatch):
    package = tmp_path / "flashbench"
    shutil.copytree(ROOT / PACKAGE, package)
    cli = package / "cli.py"
    cli.write_text(cli.read_text().replace("    from .pages import absent_page, render\n",
                                           "    from .pages import absent_page, render\n    from . import headtohead\n"))
    caches = (codegraph._tree, codegraph._module_uses, codegraph.command_modules)  # what was read of the package
    monkeypatch.setattr(codegraph, "PACKAGE", package)
    for cache in caches:
        cache.cache_clear()
    try:
        assert "headtohead" in codegraph.command_modules("pages")
    finally:
        for cache in caches:
            cache.cache_clear()


# One process runs every command below, each in a fork of its own that has imported only cli of the
# package (every command's first import, codegraph.ALWAYS) and the third-party libraries the commands
# use, whose import would otherwise take longer than most of the commands: what each fork has imported
# of the package once its command has run is that command's, as in a process of its own.
RUN_EACH = """
import json, os, sys
import matplotlib
matplotlib.use("Agg")
import jinja2, markdown, matplotlib.pyplot, numpy, pandas, seaborn
from flashbench import cli
for argv, out in json.loads(sys.argv[1]):
    pid = os.fork()
    if pid == 0:
        err = os.open(out + ".stderr", os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        os.dup2(err, 2)
        sys.stdout = open(os.devnull, "w")
        try:
            cli.main(argv)
            modules = sorted(m.split(".")[1] for m in sys.modules if m.startswith("flashbench."))
            with open(out, "w") as f:
                json.dump(modules, f)
            code = 0
        except BaseException:
            import traceback
            traceback.print_exc()
            code = 1
        sys.stderr.flush()
        os._exit(code)
    os.waitpid(pid, 0)
"""

COMMANDS = [
    ["render", "--results", "results/nvidia-h200", "--reports", "{tmp}", "--template",
     "workflow/templates/report.md.j2", "--slug", "nvidia-h200", "--settings", "{settings}"],
    ["compare", "--results", "results/nvidia-h200", "--template", "workflow/templates/compare.md.j2", "--table",
     "{tmp}/README.md", "--figure", "{tmp}/compare.png"],
    ["pages", "--sources", "reports/nvidia-h200/report.md", "--out-dir", "{tmp}"],
    ["agreement", "results/nvidia-h200", "results/nvidia-h200"],
]


@pytest.fixture(scope="module")
def imported_by(tmp_path_factory, settings_file):
    """For each of COMMANDS (by its index): whether it ran (no exception), what it wrote on stderr, and
    the package modules imported once it had run."""
    import json

    tmp = tmp_path_factory.mktemp("commands")
    runs = []
    for i, argv in enumerate(COMMANDS):
        (tmp / str(i)).mkdir()
        argv = [a.replace("{tmp}", str(tmp / str(i))).replace("{settings}", settings_file) for a in argv]
        runs.append((argv, str(tmp / f"{i}.json")))
    proc = subprocess.run([sys.executable, "-c", RUN_EACH, json.dumps(runs)], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    found = {}
    for i, (_, out) in enumerate(runs):
        ran = os.path.exists(out)
        found[i] = (ran, open(out + ".stderr").read(), set(json.load(open(out))) if ran else set())
    return found


@pytest.mark.parametrize("index", range(len(COMMANDS)), ids=[f"argv{i}" for i in range(len(COMMANDS))])
def test_what_a_command_imports_when_it_runs_is_in_its_graph(index, imported_by):
    """The graph against the truth: the package modules a command has imported once it has run."""
    command = COMMANDS[index][0]
    ran, stderr, imported = imported_by[index]
    assert ran, stderr
    assert imported and imported <= codegraph.command_modules(command), imported - codegraph.command_modules(command)
