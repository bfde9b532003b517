"""Which of the package's files a command runs, read from the source: its rule's code inputs, so that
editing a module reruns exactly the jobs whose command uses it.

`python -m flashbench <command>` runs `__main__`, `__init__`, cli's module-level imports and the
command's function in cli with every cli function it calls; from there every import of the package,
at any depth (a function-level import too), and every module the command starts as a process of its
own (`[..., "-m", "flashbench", "launch-once", ...]` under ncu, `"-m", "flashbench.clocks"`), with
that command's files in turn.

    codegraph.command_files("bench")   # [".../__init__.py", ".../clocks.py", ...], sorted
"""
from __future__ import annotations

import ast
import functools
from pathlib import Path

PACKAGE = Path(__file__).parent
ALWAYS = ("__init__", "__main__", "cli")  # what `python -m flashbench` runs before any command


@functools.cache
def _tree(module: str) -> ast.Module:
    return ast.parse((PACKAGE / f"{module}.py").read_text())


def _is_module(name: str) -> bool:
    return (PACKAGE / f"{name}.py").is_file()


def _strings(node: ast.List) -> list[str | None]:
    return [e.value if isinstance(e, ast.Constant) and isinstance(e.value, str) else None for e in node.elts]


def _uses(nodes) -> tuple[set[str], set[str]]:
    """The package modules imported anywhere within `nodes`, and the commands they start as processes."""
    modules, commands = set(), set()
    for node in (n for top in nodes for n in ast.walk(top)):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            if node.module:
                modules.add(node.module.split(".")[0])
            else:
                modules |= {a.name for a in node.names if _is_module(a.name)}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("flashbench."):
            modules.add(node.module.split(".")[1])
        elif isinstance(node, ast.Import):
            modules |= {a.name.split(".")[1] for a in node.names if a.name.startswith("flashbench.")}
        elif isinstance(node, ast.List):
            words = _strings(node)
            for i, word in enumerate(words[:-1]):
                if word != "-m":
                    continue
                if words[i + 1] == "flashbench" and i + 2 < len(words) and words[i + 2]:
                    commands.add(words[i + 2])
                elif (words[i + 1] or "").startswith("flashbench."):
                    modules.add(words[i + 1].split(".")[1])
    return {m for m in modules if _is_module(m)}, commands


@functools.cache
def _module_uses(module: str) -> tuple[frozenset[str], frozenset[str]]:
    """_uses of a whole module, read once per process (a Snakemake run asks for a command's files at
    every rule that runs it)."""
    modules, commands = _uses([_tree(module)])
    return frozenset(modules), frozenset(commands)


def _cli_functions() -> dict[str, ast.FunctionDef]:
    return {node.name: node for node in _tree("cli").body if isinstance(node, ast.FunctionDef)}


def _called_in_cli(name: str) -> set[str]:
    """`name` and every cli function it refers to, transitively."""
    functions, seen, todo = _cli_functions(), set(), [name]
    while todo:
        current = todo.pop()
        if current in seen:
            continue
        seen.add(current)
        todo += [n.id for n in ast.walk(functions[current]) if isinstance(n, ast.Name) and n.id in functions]
    return seen


@functools.cache
def command_function(command: str) -> str:
    """The name of the cli function `command` runs."""
    from .cli import parser

    choices = next(a for a in parser()._actions if a.dest == "command").choices
    if command not in choices:
        raise KeyError(f"no command {command!r} (commands: {', '.join(choices)})")
    return choices[command].get_default("run").__name__


@functools.cache
def command_modules(command: str) -> frozenset[str]:
    """The package modules `python -m flashbench <command>` runs (names, as `timing`)."""
    functions = _cli_functions()
    top = [node for node in _tree("cli").body if not isinstance(node, (ast.FunctionDef, ast.ClassDef))]
    modules, commands = _uses(top + [functions[f] for f in _called_in_cli(command_function(command))])
    for other in commands - {command}:
        modules |= command_modules(other)
    todo, seen = [*modules, *ALWAYS], set()
    while todo:
        module = todo.pop()
        if module in seen:
            continue
        seen.add(module)
        if module == "cli":
            continue  # its functions are followed above, command by command
        found, started = _module_uses(module)
        todo += list(found)
        for other in started - {command}:
            todo += list(command_modules(other))
    return frozenset(seen)


def command_files(command: str, folder: str = "workflow/flashbench") -> list[str]:
    """command_modules as the checkout's files (`folder`/<name>.py), sorted."""
    return sorted(f"{folder}/{m}.py" for m in command_modules(command))
