"""README's first screen quotes the archive, and its commands are the ones that run.

The headline figures sit between `<!-- headline: from results/<gpu>/ ... -->` and `<!-- /headline -->`:
a sentence naming the headline version in bold, the commit it was measured at and how many points it
is ahead at, and a table with a row per (S, rival). Each row's figures are recomputed here from
`head_to_head.csv` and `cycles.csv` with the rounding README uses, so a figure that no longer matches
the archive fails this test."""
from __future__ import annotations

import argparse
import json
import re

import pandas as pd

from flashbench import cli, gpu

from conftest import ROOT

README = ROOT / "README.md"
BLOCK = re.compile(r"<!-- headline: from (results/[^/\s]+)/[^>]*-->\n(.*?)\n<!-- /headline -->", re.S)


def headline_block() -> tuple[str, str]:
    found = BLOCK.findall(README.read_text())
    assert len(found) == 1, "README needs one <!-- headline: from results/<gpu>/ --> ... <!-- /headline --> block"
    return found[0]


def first_screen() -> str:
    return "\n".join(README.read_text().splitlines()[:45])


def cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def expected_row(S: int, case_S: int, rival: str, version: str, h2h: pd.DataFrame, cycles: pd.DataFrame) -> list[str]:
    """The row README should have for `rival` at `S`, as README writes it."""
    graph = h2h[(h2h.S == S) & (h2h.version == version) & (h2h.rival == rival) & (h2h.method == "graph")]
    assert len(graph) == 1, f"head_to_head.csv has no graph row of {version} against {rival} at S={S}"
    g = graph.iloc[0]
    ours = cycles[(cycles.kernel == version) & (cycles.S == S)].cycles
    theirs = cycles[(cycles.kernel == rival) & (cycles.S == S)].cycles
    assert len(ours) == 1 and len(theirs) == 1, f"cycles.csv lacks {version} or {rival} at S={S}"
    ours, theirs = float(ours.iloc[0]), float(theirs.iloc[0])
    return [f"{S} (the case)" if S == case_S else f"{S}", f"`{rival}`", f"{g.ratio:.2f}",
            f"[{g.ci_low:.2f}, {g.ci_high:.2f}]", g.verdict, f"{ours / 1e3:.1f}k / {theirs / 1e3:.1f}k",
            f"{theirs / ours:.2f}"]


def test_the_headline_block_is_on_the_first_screen():
    folder, block = headline_block()
    assert block.splitlines()[-1] in first_screen(), "the headline figures must stay in README's first 45 lines"
    assert (ROOT / folder / "head_to_head.csv").is_file() and (ROOT / folder / "cycles.csv").is_file(), folder


def test_the_headline_figures_are_the_archives():
    folder, block = headline_block()
    results = ROOT / folder
    meta = json.loads((results / "kernels.json").read_text())
    h2h = pd.read_csv(results / "head_to_head.csv")
    cycles = pd.read_csv(results / "cycles.csv")
    case_S = meta["case"]["S"]

    version = re.search(r"\*\*(v\d+)\*\*", block)
    assert version, "the headline sentence names the version in bold, **vNN**"
    version = version.group(1)
    assert version == meta["headline"][0], f"README quotes {version}; the archive's best is {meta['headline'][0]}"

    rows = [line for line in block.splitlines() if line.startswith("|")]
    header, rule, body = rows[0], rows[1], rows[2:]
    assert f"cycles, {version} / rival" in cells(header), "the cycles column names the version it quotes"
    assert set(rule) <= set("|-: "), "the table's second line is its rule"
    assert body, "the headline table has rows"
    quoted = set()
    for line in body:
        got = cells(line)
        S = int(re.match(r"\d+", got[0]).group())
        rival = got[1].strip("`")
        assert got == expected_row(S, case_S, rival, version, h2h, cycles), f"README's row for {rival} at S={S}"
        quoted.add((S, rival))
    rivals = {rival for _, rival in quoted}
    assert {(S, r) for S in (case_S, int(h2h.S.max())) for r in rivals} <= quoted, \
        "README quotes each of its rivals at the case and at the longest S"

    # the sentence: ahead of each rival in the table, by graph, at every point of the head-to-head
    prose = " ".join(block.split())  # the sentence as read, wherever its lines break
    claim = re.search(r"ahead of each rival below by CUDA graph at all (\d+) points of the head-to-head, "
                      r"from S=(\d+) to (\d+)", prose)
    assert claim, "the headline sentence says at how many points v24 is ahead by graph"
    points = sorted(h2h.S.unique())
    assert (int(claim[1]), int(claim[2]), int(claim[3])) == (len(points), points[0], points[-1])
    graph = h2h[(h2h.version == version) & (h2h.method == "graph") & h2h.rival.isin(rivals)]
    assert len(graph) == len(points) * len(rivals) and (graph.verdict == "ahead").all(), \
        graph[graph.verdict != "ahead"][["S", "rival", "verdict"]].to_string()
    rounds = set(graph.rounds)  # whole designs of the point's contestants, at least as many as asked
    assert len(rounds) == 1 and min(rounds) >= meta["head_to_head"]["rounds"], rounds
    assert f"the median of {min(rounds)} paired rounds" in prose

    commit = re.search(r"measured at commit ([0-9a-f]{7,40})", prose)
    assert commit, "the headline sentence names the commit the archive was measured at"
    for kind in ("head_to_head", "cycles"):
        for record in sorted((results / kind).glob("*.json")):
            measured = gpu.measured_commit(json.loads(record.read_text())["provenance"])
            assert measured.split()[0].startswith(commit[1]), f"{record.relative_to(ROOT)} was measured at {measured}"


CAUSAL = re.compile(r"<!-- causal: from (results/[^/\s]+)/[^>]*-->\n(.*?)\n<!-- /causal -->", re.S)


def test_the_causal_figures_are_the_archives():
    """The sentence on the causal configuration: v25 ahead of FlashAttention's kernel and of cuDNN by CUDA graph
    at every point (the range of the ratios), the range of their cycles over v25's, and v25's efficiency per
    cycle at the longest S, each as the archive has it."""
    (folder, block), = CAUSAL.findall(README.read_text())
    assert block.splitlines()[-1] in first_screen(), "the causal figures must stay in README's first 45 lines"
    results = ROOT / folder
    meta = json.loads((results / "kernels.json").read_text())
    version = f"{meta['headline'][0]}.causal"
    h2h = pd.read_csv(results / "head_to_head.csv")
    h2h = h2h[(h2h.config == "causal") & (h2h.version == version) & (h2h.method == "graph")]
    cycles = pd.read_csv(results / "cycles.csv").set_index(["kernel", "S"]).cycles
    points = sorted(h2h.S.unique())

    def ranges(rival):
        mine = h2h[h2h.rival == f"{rival}.causal"].set_index("S")
        assert sorted(mine.index) == points and (mine.verdict == "ahead").all(), rival
        by_cycles = [cycles[(f"{rival}.causal", S)] / cycles[(version, S)] for S in points]
        return f"{mine.ratio.min():.2f}-{mine.ratio.max():.2f}", f"{min(by_cycles):.2f}-{max(by_cycles):.2f}"

    (fa_graph, fa_cycles), (cudnn_graph, cudnn_cycles) = ranges("flash_attn_cute"), ranges("sdpa_cudnn")
    longest = pd.read_csv(results / "cycles.csv").query("kernel == @version and S == @points[-1]")
    efficiency = f"{100 * float(longest.efficiency_per_cycle.iloc[0]):.1f}%"
    assert " ".join(block.split()) == (
        f"Under the causal mask, {meta['headline'][0]} is ahead of FlashAttention's kernel by CUDA graph at every S "
        f"from {points[0]} to {points[-1]} ({fa_graph}) and of cuDNN ({cudnn_graph}), by cycles {fa_cycles} and "
        f"{cudnn_cycles}, and it reaches {efficiency} of the tensor peak per cycle at S={points[-1]}.")


CONFIGURATIONS = re.compile(r"<!-- configurations: from config.yaml[^>]*-->\n(.*?)\n<!-- /configurations -->", re.S)


def configuration_rows() -> list[str]:
    """README's table of the configurations, a row each as config.yaml says: what it computes, the rivals it is
    raced against, and what its next goal holds it to."""
    from flashbench.config import load

    settings = load(ROOT / "config.yaml")
    rows = []
    for c in settings.configurations:
        asked = settings.goal.in_configuration(c.name).next
        if asked.cycles_of:
            held = f"cycles within {asked.cycles_of['within']:.0%} of `{asked.cycles_of['configuration']}`'s"
        else:
            held = "; ".join(filter(None, [
                ", ".join(f"{factor:.2f}x {rival}" for rival, factor in asked.factors.items()),
                f"{asked.efficiency_case:.0%} per cycle at the case" if asked.efficiency_case is not None else "",
                f"{asked.efficiency_long:.0%} per cycle from S={asked.long_s}" if asked.efficiency_long is not None
                else ""]))
        rivals = ", ".join(settings.run(run).of for run in settings.rivals_in(c)) or "no one"
        rows.append(f"| `{c.name}` | {c.mask} | {c.D} | {c.dtype} | {f'H / {c.kv_group}' if c.kv_group > 1 else 'H'} "
                    f"| {rivals} | {held} |")
    return rows


def test_the_configurations_table_is_config_yamls():
    (block,) = CONFIGURATIONS.findall(README.read_text())
    assert [line for line in block.splitlines() if line.startswith("| `")] == configuration_rows()


def readme_command(prefix: str) -> str:
    """The indented command line of README's "Two commands" that the sentence starting `prefix` introduces."""
    text = README.read_text()
    section = text[text.index("## Two commands"):]
    section = section[:section.index("\n## ", 1)]
    after = section[section.index(prefix):]
    return next(line[4:] for line in after.splitlines() if line.startswith("    "))


def test_readmes_test_command_is_what_ci_runs():
    ci = [line for line in (ROOT / ".ci" / "run").read_text().splitlines() if line.strip()]
    assert readme_command("Run the tests") == ci[-1]
    assert readme_command("Run the tests") in first_screen()
    assert "chromium" in (ROOT / ".ci" / "run").read_text() and "`chromium`" in first_screen()


def test_readmes_flashbench_commands_exist():
    """Every `flashbench X` and `python -m flashbench X` README names is a subcommand of the command
    line, and `flashbench` is the project's console script."""
    import tomllib

    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["flashbench"] == "flashbench.cli:main"
    subcommands = {name for action in cli.parser()._actions if isinstance(action, argparse._SubParsersAction)
                   for name in action.choices}
    named = re.findall(r"(?:python -m )?\bflashbench ([a-z][a-z-]*)", README.read_text())
    assert named, "README names no flashbench command"
    assert set(named) <= subcommands, set(named) - subcommands


def test_the_console_scripts_main_returns_the_exit_status(capsys):
    """The console script calls sys.exit(main()): main returns 1 after its one error line."""
    assert cli.main(["agreement", "/nonexistent/first", "/nonexistent/second"]) == 1
    assert capsys.readouterr().err.startswith("error: ")


def layout() -> dict[str, str]:
    """README's Layout, each entry's text by its path (continuation lines joined to their entry)."""
    block = README.read_text().split("## Layout\n")[1].split("\n## ")[0]
    entries, current = {}, None
    for line in block.splitlines():
        if line.startswith("    ") and not line.startswith("     "):
            current, _, text = line[4:].partition(" ")
            entries[current] = text
        elif line.startswith("      ") and current:
            entries[current] += " " + line.strip()
    return entries


def named(text: str) -> set[str]:
    """The words of a Layout entry that are names (identifiers), outside parentheses' explanations too."""
    return set(re.findall(r"\b[a-z_][a-z0-9_]*\b", text))


def test_the_layout_names_every_module_and_rule_file_and_only_paths_that_exist():
    entries = layout()
    modules = {p.stem for p in (ROOT / "workflow" / "flashbench").glob("*.py")} - {"__init__", "__main__"}
    missing = modules - named(entries["workflow/flashbench/"])
    assert not missing, f"README's Layout lacks the package's modules {sorted(missing)}"
    rules = {p.stem for p in (ROOT / "workflow" / "rules").glob("*.smk")}
    listed = set(re.findall(r"\b(\w+)(?: \([^)]*\))?(?:,|$)", entries["workflow/rules/*.smk"].split(":", 1)[1]))
    assert listed == rules, f"README's Layout lists rule files {sorted(listed)}, the workflow has {sorted(rules)}"
    for path in entries:
        if "<" not in path and "..." not in path and "*" not in path:
            for part in path.split():
                assert (ROOT / part.rstrip("/")).exists() or (ROOT / "kernels" / part).exists(), \
                    f"README's Layout names {part}, which is not in the repository"
