"""A rule's code inputs are the files its command runs, read from the import graph (codegraph)."""
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
    commands = {}
    for rule, inputs, command in jobs(proc.stdout) + jobs(compiles.stdout):
        name = re.search(r"-m flashbench ([a-z-]+)", command)
        if not name:
            continue
        code = {path for path in inputs if path.startswith(PACKAGE + "/")}
        assert code == set(codegraph.command_files(name[1])), rule
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
    monkeypatch.setattr(codegraph, "PACKAGE", package)
    codegraph._tree.cache_clear()
    try:
        assert "headtohead" in codegraph.command_modules("pages")
    finally:
        codegraph._tree.cache_clear()


PRINT_MODULES = ("import sys; from flashbench import cli; code = cli.main(sys.argv[1:]); "
                 "print(' '.join(sorted(m.split('.')[1] for m in sys.modules if m.startswith('flashbench.'))))")


@pytest.mark.parametrize("argv", [
    ["render", "--results", "results/nvidia-h200", "--reports", "{tmp}", "--template",
     "workflow/templates/report.md.j2", "--slug", "nvidia-h200", "--settings", "{settings}"],
    ["compare", "--results", "results/nvidia-h200", "--template", "workflow/templates/compare.md.j2", "--table",
     "{tmp}/README.md", "--figure", "{tmp}/compare.png"],
    ["pages", "--sources", "reports/nvidia-h200/report.md", "--out-dir", "{tmp}"],
    ["agreement", "results/nvidia-h200", "results/nvidia-h200"],
])
def test_what_a_command_imports_when_it_runs_is_in_its_graph(argv, tmp_path, settings_file):
    """The graph against the truth: the package modules a command has imported once it has run."""
    argv = [a.replace("{tmp}", str(tmp_path)).replace("{settings}", settings_file) for a in argv]
    proc = subprocess.run([sys.executable, "-c", PRINT_MODULES, *argv], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    imported = set(proc.stdout.split("\n")[-2].split())
    assert imported and imported <= codegraph.command_modules(argv[0]), imported - codegraph.command_modules(argv[0])
