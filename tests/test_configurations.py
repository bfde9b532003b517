"""An archive of a run in two configurations (the case's and the causal mask), and in four, from synthetic records
(tests/records.py) through summarize's tables to the reports: every table carries the configuration
of each row, the tables are checked configuration by configuration, under the causal mask FLOPs count
as half, and hopper.md has a part per configuration and one table of their goals."""
import pandas as pd
import pytest

import records
from flashbench import archive_tables, config, cycles, gpu_reports, headtohead
from flashbench.files import write_json, write_text
from flashbench.summary import tidy_tables
from flashbench.validation import BadRecord, Expected

from conftest import ROOT, shipped_settings

DENSE = {"name": "dense", "mask": "none", "D": 128, "dtype": "fp16"}
CAUSAL = {"name": "causal", "mask": "causal", "D": 128, "dtype": "fp16"}
# every kernel and peer runs in the first configuration; v15 (the headline's first) and the peers in the causal
CAUSAL_RUNS = ["v15", "sdpa_auto", "unfused"]
TFLOPS = {**records.LIKE_THE_WRITEUP, "v14": 400.0, "v15": 450.0}
CAUSAL_TFLOPS = {"v15.causal": 380.0, "sdpa_auto.causal": 300.0, "unfused.causal": 60.0}


def run_of(entry: dict, configuration: dict) -> dict:
    """`entry` (a kernel's or peer's, as records.py has them) as its run in `configuration`."""
    first = configuration is DENSE
    return {**entry, "name": entry["name"] if first else f"{entry['name']}.{configuration['name']}",
            "of": entry["name"], "config": configuration["name"], "causal": configuration["mask"] == "causal"}


def write_archive(tmp, monkeypatch, others: list[tuple[dict, list[str]]], tflops: dict, contestants: dict,
                  expected: Expected, adjust=None, asks: dict | None = None):
    """results/nvidia-h200/ of a run in dense and the configurations of `others`, as summarize writes it:
    every kernel and peer in dense, and each other configuration's runs (at its D); the head-to-head's
    `contestants` (by configuration name; none: not raced there) at the case and each swept S, `adjust`
    (a configuration's name -> what to do to its points) applied; `asks`: head_to_head.configurations."""
    kernels = records.KERNELS + records.HOPPER
    by_name = {k["name"]: k for k in kernels + records.PEERS}
    seconds = []
    for configuration, runs in others:
        D = configuration["D"]
        seconds += [{**run_of(by_name[n], configuration), **({"D": D} if D != records.CASE["D"] else {})} for n in runs]
        monkeypatch.setitem(records.RESOURCES, f"v15.{configuration['name']}", records.RESOURCES["v15"])
        monkeypatch.setitem(records.LSU, f"v15.{configuration['name']}", records.LSU["v15"])
    paths = records.write(tmp, tflops, kernels=kernels + seconds)
    paths["profiles"] = [p for p in paths["profiles"] if "." not in p.stem]  # the first configuration's alone
    entries = [run_of(k, DENSE) for k in kernels + records.PEERS] + [{k: v for k, v in e.items() if k != "D"}
                                                                      for e in seconds]
    configurations = [DENSE, *(c for c, _ in others)]
    settings = {**records.SETTINGS, "configurations": configurations}
    if asks:
        settings["head_to_head"] = {**settings["head_to_head"], "configurations": asks}
    summary, resources, profile, meta = tidy_tables(entries, paths["checks"], paths["benches"], paths["compiled"],
                                                    "sm_90", records.CASE, paths["sweeps"], paths["profiles"],
                                                    settings, expected=expected)
    shapes = [records.CASE, *({**records.CASE, "S": S} for S in records.SWEEP_S if S != records.CASE["S"])]
    points, counts = [], []
    for configuration in configurations:
        asked = (asks or {}).get(configuration["name"], {}).get("S")  # the points it names, else every length
        at = [shape for shape in shapes if asked is None or shape["S"] in asked]
        for seed, shape in enumerate(at if contestants[configuration["name"]] else []):  # none: not raced
            back_to_back = (asks or {}).get(configuration["name"], {}).get("back_to_back", True)
            point = records.head_to_head_record({**shape, "D": configuration["D"]}, contestants[configuration["name"]],
                                                seed, back_to_back)
            point = {**point, "is_case": shape == records.CASE, "configuration": configuration["name"],
                     "causal": configuration["mask"] == "causal"}
            points.append((adjust or {}).get(configuration["name"], lambda p: p)(point))
    headlines = {f"v15.{c['name']}" for c, _ in others}  # counted at every S, raced or not
    paired = {name for timed in contestants.values() for name in timed} | headlines
    for e in entries:
        asked = (asks or {}).get(e.get("config"), {}).get("S")  # its configuration's points, else every length
        at = [{**s, "D": expected.case_of(e["name"])["D"]} for s in shapes if asked is None or s["S"] in asked]
        counts.append(records.cycles_record(e["name"], at if e["name"] in paired else at[:1], 100.0))

    def contestants_of(name):
        headline = [n for n in contestants[name or "dense"] if n.partition(".")[0] in records.HEADLINE]
        return headline, [n for n in contestants[name or "dense"] if n not in headline]

    out = tmp / "results" / "nvidia-h200"
    tables = {"summary": summary, "resources": resources, "profile": profile,
              "head_to_head": headtohead.table(points, settings, contestants_of),
              "cycles": cycles.table(counts, entries, expected.case_of)}
    for name, table in tables.items():
        write_text(out / f"{name}.csv", table.to_csv(index=False))
    write_json(out / "kernels.json", meta)
    return out


def halved(point: dict) -> dict:
    """A causal point: the records' times are of the dense FLOPs, half of them here."""
    for c in point["contestants"].values():
        for r in c["rounds"]:
            for method in point.get("methods", config.METHODS):
                r[f"{method}_s"] /= 2
    return point


@pytest.fixture(scope="module")
def archive(tmp_path_factory, monkeypatch_module):
    """results/nvidia-h200/ of the two-configuration run, as summarize writes it."""
    entries = [run_of(k, DENSE) for k in records.KERNELS + records.HOPPER + records.PEERS] + \
        [run_of({"name": n}, CAUSAL) for n in CAUSAL_RUNS]
    expected = Expected(**{**records.EXPECTED.__dict__,
                           "peers": [e["name"] for e in entries if e["name"].partition(".")[0] in
                                     {p["name"] for p in records.PEERS}],
                           "causal": [*(e["name"] for e in entries if e["causal"]), CAUSAL["name"]]})
    return write_archive(tmp_path_factory.mktemp("configurations"), monkeypatch_module, [(CAUSAL, CAUSAL_RUNS)],
                         {**TFLOPS, **CAUSAL_TFLOPS},
                         {"dense": {"v15": 450.0, "v14": 400.0, "sdpa_auto": 430.0},
                          "causal": {"v15.causal": 380.0, "sdpa_auto.causal": 300.0}}, expected, {"causal": halved})


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as mp:
        yield mp


def test_every_table_says_each_rows_configuration(archive):
    for name in ("summary", "resources", "head_to_head", "cycles"):
        table = pd.read_csv(archive / f"{name}.csv")
        assert set(table.config) == {"dense", "causal"}, name
    head_to_head = pd.read_csv(archive / "head_to_head.csv")
    causal = head_to_head[head_to_head.config == "causal"]
    assert set(causal.version) == {"v15.causal"} and set(causal.rival) == {"sdpa_auto.causal"}
    # the causal points' times are half the dense ones: the same TFLOPS, as their FLOPs count as half
    assert causal.version_tflops.median() == pytest.approx(380.0, rel=0.02)
    profile = pd.read_csv(archive / "profile.csv")
    assert set(profile.config) == {"dense"}


def test_each_configurations_view_is_a_run_of_that_configuration_alone(archive):
    summary, _, _, meta = archive_tables.read_tables(archive)
    paired = archive_tables.read_paired(archive, meta, summary)
    causal_summary, causal_meta, causal = archive_tables.view(summary, meta, paired, CAUSAL)
    assert [k["name"] for k in causal_meta["kernels"]] == CAUSAL_RUNS and causal_meta["headline"] == ["v15"]
    assert set(causal_summary.kernel) == set(CAUSAL_RUNS) and set(causal["head_to_head"].version) == {"v15"}
    dense_summary, dense_meta, _ = archive_tables.view(summary, meta, paired, DENSE)
    assert "v15.causal" not in set(dense_summary.kernel) and dense_meta["headline"] == ["v15", "v14"]


def test_a_configuration_asking_its_own_head_to_head_points_is_viewed_at_those_alone(archive):
    """head_to_head.configurations in kernels.json: a configuration's view has its own points (their S) and
    settings, the first's view head_to_head's own; a row at a point the configuration does not name is
    a problem of its table, naming it."""
    summary, _, _, meta = archive_tables.read_tables(archive)
    paired = archive_tables.read_paired(archive, meta, summary)
    lengths = sorted(set(paired["head_to_head"].S))
    asked = {**meta, "head_to_head": {**meta["head_to_head"], "configurations": {
        "causal": {"S": lengths[1:], "energy_rounds": 0}}}}
    causal_summary, causal_meta, causal = archive_tables.view(summary, asked, paired, CAUSAL)
    problem = archive_tables.head_to_head_problem(causal["head_to_head"], causal_meta, causal_summary)
    assert f"S={lengths[0]}" in problem and "is not a point of the head-to-head" in problem
    table = paired["head_to_head"]
    kept = {**paired, "head_to_head": table[(table.config != "causal") | (table.S != lengths[0])]}
    causal_summary, causal_meta, causal = archive_tables.view(summary, asked, kept, CAUSAL)
    assert archive_tables.head_to_head_problem(causal["head_to_head"], causal_meta, causal_summary) is None
    assert sorted(p["S"] for p in archive_tables.head_to_head_points(causal_meta)) == lengths[1:]
    assert causal_meta["head_to_head"]["energy_rounds"] == 0 and "configurations" not in causal_meta["head_to_head"]
    assert set(causal["head_to_head"].S) == set(lengths[1:])
    _, dense_meta, _ = archive_tables.view(summary, asked, kept, DENSE)
    case_S = meta["case"]["S"]  # the case first, then the other lengths
    assert [p["S"] for p in archive_tables.head_to_head_points(dense_meta)] == [case_S, *(S for S in lengths if S != case_S)]
    assert dense_meta["head_to_head"]["energy_rounds"] == meta["head_to_head"]["energy_rounds"]


def test_a_causal_timing_counted_as_dense_is_refused(archive, tmp_path):
    """The FLOPs of a causal run are half a dense one's: a figure that counts them whole is refused."""
    import shutil

    copy = shutil.copytree(archive, tmp_path / "nvidia-h200")
    summary = pd.read_csv(copy / "summary.csv")
    row = (summary.kernel == "v15.causal") & (summary.series == "sweep")
    summary.loc[row, "tflops"] *= 2
    summary.to_csv(copy / "summary.csv", index=False)
    with pytest.raises(BadRecord, match=r"v15\.causal, sweep S=512\): tflops .* is not what ms_per_step"):
        archive_tables.read_tables(copy)


def test_hopper_md_has_a_part_per_configuration_and_one_table_of_their_goals(archive, tmp_path):
    reports = tmp_path / "reports"
    gpu_reports.render(archive, reports, ROOT / "workflow" / "templates" / "report.md.j2", "nvidia-h200",
                       shipped_settings().goal)
    hopper, chapter = (reports / "hopper.md").read_text(), (reports / "report.md").read_text()
    dense, causal = hopper.split("# The line in the configuration causal (the causal mask, D=128, fp16)")
    assert "**dense** (no mask, D=128, fp16)" in dense and "v15.causal" not in hopper
    assert "FLOPs are counted as half, 2·B·H·S²·D" in causal and "| v15 |" in causal
    assert "Not run in this configuration, as config's `configurations` of each says: v14." in causal
    goals = causal.split("# The goals in every configuration")[1]
    assert "| dense (no mask, D=128, fp16) | v15 |" in goals and "| causal (the causal mask, D=128, fp16) | v15 |" in goals
    assert "a ragged S against the next multiple of 128, paired |" in goals
    assert ".causal" not in chapter and "unfused" in chapter


def test_a_causal_runs_efficiency_per_cycle_counts_half_the_flops(archive):
    cycles = pd.read_csv(archive / "cycles.csv").set_index(["kernel", "S"])
    dense, causal = cycles.loc[("v15", 1024)], cycles.loc[("v15.causal", 1024)]
    assert dense.cycles == causal.cycles  # the records' counts: the same for both
    assert causal.efficiency_per_cycle == pytest.approx(dense.efficiency_per_cycle / 2)


@pytest.mark.parametrize("table, kernel, config", [("summary.csv", "v15", "causal"),
                                                   ("resources.csv", "v15.causal", "dense"),
                                                   ("cycles.csv", "sdpa_auto.causal", "dense")])
def test_a_row_moved_to_another_configuration_is_refused(archive, tmp_path, table, kernel, config):
    import shutil

    copy = shutil.copytree(archive, tmp_path / "nvidia-h200")
    rows = pd.read_csv(copy / table)
    rows.loc[rows.kernel == kernel, "config"] = config
    rows.to_csv(copy / table, index=False)
    with pytest.raises(BadRecord, match=rf"config '{config}', but kernels.json says {kernel} runs in '"):
        summary, _, _, meta = archive_tables.read_tables(copy)
        archive_tables.read_paired(copy, meta, summary)


def test_a_record_whose_mask_is_not_its_runs_is_refused(tmp_path):
    """A causal run's timing, or a causal point, that says it ran without the mask (so its FLOPs count
    whole) is refused as it is read."""
    from flashbench.validation import read_record

    expected = Expected(**{**records.EXPECTED.__dict__, "causal": ["v15.causal", "causal"]})
    bench = {"kernel": "v15.causal", "timed": True, "reason": None, "cubin_sha256": "a" * 64,
             "timing": records.timing(380.0), "provenance": records.provenance("v15.causal")}
    write_json(tmp_path / "v15.causal.json", bench)
    with pytest.raises(BadRecord, match="key 'timing.causal': False, but v15.causal runs under the causal mask"):
        read_record(tmp_path / "v15.causal.json", "bench", expected)
    point = {**records.head_to_head_record(records.CASE, {"v15.causal": 380.0}, 0), "configuration": "causal"}
    write_json(tmp_path / "S1024.causal.json", point)
    with pytest.raises(BadRecord, match="key 'causal': False, but causal runs under the causal mask"):
        read_record(tmp_path / "S1024.causal.json", "head_to_head", expected)


# ---- a configuration at another head dim: the same pipeline at D=64 ---------------------------------

D64 = {"name": "d64", "mask": "none", "D": 64, "dtype": "fp16"}
D64_RUNS = ["v15", "sdpa_auto"]


@pytest.fixture(scope="module")
def d64_archive(tmp_path_factory, monkeypatch_module):
    """results/nvidia-h200/ of a run in dense and d64, v15 and sdpa_auto in both: every record of a d64 run
    at D=64, as the pipeline's commands take its shapes (Settings.in_configuration)."""
    peers = [p["name"] for p in records.PEERS]
    expected = Expected(**{**records.EXPECTED.__dict__, "peers": [*peers, "sdpa_auto.d64"],
                           "head_dims": {"v15.d64": 64, "sdpa_auto.d64": 64}, "configuration_head_dims": {"d64": 64}})
    return write_archive(tmp_path_factory.mktemp("d64"), monkeypatch_module, [(D64, D64_RUNS)],
                         {**TFLOPS, "v15.d64": 300.0, "sdpa_auto.d64": 280.0},
                         {"dense": {"v15": 450.0, "v14": 400.0, "sdpa_auto": 430.0},
                          "d64": {"v15.d64": 300.0, "sdpa_auto.d64": 280.0}}, expected)


def test_a_configuration_at_d64_is_summarized_read_back_and_reported_at_its_head_dim(d64_archive, tmp_path):
    summary = pd.read_csv(d64_archive / "summary.csv")
    mine = summary[summary.config == "d64"]
    assert set(mine.D) == {64} and set(summary[summary.config == "dense"].D) == {128}
    at_case = mine[(mine.series == "check") & mine.is_case & (mine.inputs == "normal")]
    assert set(at_case.kernel) == {"v15.d64", "sdpa_auto.d64"} and at_case.tflops.notna().all()
    counted = pd.read_csv(d64_archive / "cycles.csv")
    assert set(counted[counted.config == "d64"].D) == {64} and counted[(counted.config == "d64") & counted.is_case].shape[0] == 2
    summary_read, _, _, meta = archive_tables.read_tables(d64_archive)  # each table checked configuration by configuration
    paired = archive_tables.read_paired(d64_archive, meta, summary_read)
    _, d64_meta, d64_tables = archive_tables.view(summary_read, meta, paired, D64)
    assert d64_meta["case"] == {**records.CASE, "D": 64} and set(d64_tables["head_to_head"].D) == {64}
    reports = tmp_path / "reports"
    gpu_reports.render(d64_archive, reports, ROOT / "workflow" / "templates" / "report.md.j2", "nvidia-h200",
                       shipped_settings().goal)
    part = (reports / "hopper.md").read_text().split("# The line in the configuration d64 (no mask, D=64, fp16)")[1]
    assert "## The line at the case (B=1, H=64, S=1024, D=64)" in part
    assert "| d64 (no mask, D=64, fp16) | v15 |" in part.split("# The goals in every configuration")[1]


# ---- a configuration raced by no one: a bf16 twin, its headline counted against its fp16 configuration's --

BF16 = {"name": "bf16", "mask": "none", "D": 128, "dtype": "bf16"}


@pytest.fixture(scope="module")
def twin_archive(tmp_path_factory, monkeypatch_module):
    """results/nvidia-h200/ of a run in dense and bf16, where bf16 has no rivals (head_to_head.configurations
    .bf16.rivals: []): v15.bf16 checked, timed, swept and counted at every S, no head-to-head point."""
    return write_archive(tmp_path_factory.mktemp("twin"), monkeypatch_module, [(BF16, ["v15"])],
                         {**TFLOPS, "v15.bf16": 445.0},
                         {"dense": {"v15": 450.0, "v14": 400.0, "sdpa_auto": 430.0}, "bf16": {}}, records.EXPECTED,
                         asks={"bf16": {"rivals": []}})


def test_a_configuration_raced_by_no_one_is_judged_by_its_cycles_alone(twin_archive, tmp_path):
    h2h = pd.read_csv(twin_archive / "head_to_head.csv")
    assert set(h2h.config) == {"dense"}
    counted = pd.read_csv(twin_archive / "cycles.csv")
    assert sorted(counted[counted.kernel == "v15.bf16"].S) == sorted(records.SWEEP_S)
    reports = tmp_path / "reports"
    gpu_reports.render(twin_archive, reports, ROOT / "workflow" / "templates" / "report.md.j2", "nvidia-h200",
                       shipped_settings().goal)
    part = (reports / "hopper.md").read_text().split("# The line in the configuration bf16 (no mask, D=128, bf16)")[1]
    goals = part.split("# The goals in every configuration")[1]
    # bf16's goal, its cycles within 2% of dense's best version's, judged at the case and every S from 1024:
    # the records count both the same
    row = next(line for line in goals.splitlines() if line.startswith("| bf16 "))
    assert "| v15 | not asked (no rivals) | reached |" in row
    assert "No rivals in this configuration (none of config's head-to-head rivals runs here)" in part
    assert "| S=2048 | 1.000 | 1.02 | yes |" in part  # its cycles over dense's, counted without a head-to-head
    assert "The line's best over S (thousands of cycles" in part


CAUSAL_BF16 = {"name": "causal_bf16", "mask": "causal", "D": 128, "dtype": "bf16"}
GQA_CAUSAL = {"name": "gqa_causal", "mask": "causal", "D": 128, "dtype": "fp16", "kv_group": 8}


def test_configurations_raced_and_unraced_under_the_mask_each_judged_as_config_asks(tmp_path, monkeypatch):
    """dense and causal raced, causal by graph alone; causal_bf16 and gqa_causal, under the mask, raced by no
    one and each held by the shipped goal to causal's cycles: every part rendered, every configuration in
    the goals' table, the unraced ones judged from their counts against causal's."""
    unraced = {"rivals": []}
    causal_runs = ["v15.causal", "sdpa_auto.causal", "unfused.causal"]
    expected = Expected(**{**records.EXPECTED.__dict__,
                           "peers": [*(p["name"] for p in records.PEERS), "sdpa_auto.causal", "unfused.causal"],
                           "causal": [*causal_runs, "v15.causal_bf16", "v15.gqa_causal", "causal", "causal_bf16",
                                      "gqa_causal"]})
    archive = write_archive(tmp_path, monkeypatch, [(CAUSAL, CAUSAL_RUNS), (CAUSAL_BF16, ["v15"]), (GQA_CAUSAL, ["v15"])],
                            {**TFLOPS, **CAUSAL_TFLOPS, "v15.causal_bf16": 378.0, "v15.gqa_causal": 376.0},
                            {"dense": {"v15": 450.0, "v14": 400.0, "sdpa_auto": 430.0},
                             "causal": {"v15.causal": 380.0, "sdpa_auto.causal": 300.0}, "causal_bf16": {},
                             "gqa_causal": {}}, expected, {"causal": halved},
                            asks={"causal": {"back_to_back": False}, "causal_bf16": unraced, "gqa_causal": unraced})
    reports = tmp_path / "reports"
    gpu_reports.render(archive, reports, ROOT / "workflow" / "templates" / "report.md.j2", "nvidia-h200",
                       shipped_settings().goal)
    hopper = (reports / "hopper.md").read_text()
    for words in ("causal (the causal mask, D=128, fp16)", "causal_bf16 (the causal mask, D=128, bf16)",
                  "gqa_causal (the causal mask, D=128, fp16, "):
        assert f"# The line in the configuration {words}" in hopper, words
    goals = hopper.split("# The goals in every configuration")[1]
    rows = {line.split(" |")[0].removeprefix("| ").split(" (")[0]: line for line in goals.splitlines()
            if line.startswith("| ") and not line.startswith("| configuration")}
    assert set(rows) >= {"dense", "causal", "causal_bf16", "gqa_causal"}
    for name in ("causal_bf16", "gqa_causal"):  # the records count every run the same: 1.000 of causal's
        assert "| v15 | not asked (no rivals) | reached |" in rows[name], rows[name]
    part = hopper.split("# The line in the configuration gqa_causal")[1].split("# The goals")[0]
    assert "its cycles at most 2% above those of the best version of causal" in part
    assert "- The line's best, v15, raced by no one here: its next goal, judged by its cycles, is reached." in part
    assert "A version's choices are its file's, the same in every configuration" in part  # listed once, in dense's
    dense, causal = (part.split("## Cycles")[0]
                     for part in hopper.split("# The line in the configuration causal (the causal mask, D=128, fp16)"))
    assert "| verdict | back to back | interval | verdict | cycles |" in dense
    assert "| verdict | cycles |" in causal and "back to back |" not in causal
    assert "no calls timed back to back here, as config's `head_to_head.back_to_back` asks" in causal
    table = pd.read_csv(archive / "head_to_head.csv")
    assert set(table[table.config == "causal"].method) == {"graph"} and set(table[table.config == "dense"].method) == \
        {"step", "graph"}
    step = table[(table.config == "dense") & (table.method == "step")].head(1).assign(config="causal", version="v15.causal",
                                                                                      rival="sdpa_auto.causal")
    pd.concat([table, step]).to_csv(archive / "head_to_head.csv", index=False)
    with pytest.raises(BadRecord, match="by step at the case\\): method 'step' is not one the head-to-head timed here "
                                        "\\(graph\\)"):
        summary, _, _, meta = archive_tables.read_tables(archive)
        archive_tables.read_paired(archive, meta, summary)


# ---- the shipped configurations, all twenty-four: what the archive run will hand the report ------------

def test_the_shipped_configurations_each_get_their_part_and_their_goal_row(tmp_path, monkeypatch):
    """config.yaml's configurations with its head-to-head's asks (rivals none, S, energy windows, back to back
    by configuration), v15 standing for the headline and sdpa_auto for the rivals in those raced: summarized,
    read back and rendered, every configuration has its part under its own title and a row in the goals'
    table, each judged, raced or not, and the figures are drawn."""
    shipped = shipped_settings()
    # each as shipped, at the records' lengths: S=512 in the first configuration alone, as config.yaml has it
    asks = {name: {**asked, "S": [S for S in records.SWEEP_S if S in asked["S"]]}
            for name, asked in shipped.head_to_head["configurations"].items()}
    first, *others = [c.as_dict() for c in shipped.configurations]
    assert first == DENSE
    raced = [c for c in others if asks.get(c["name"], {}).get("rivals") != []]
    assert len(others) == 23 and len(raced) == 5  # the write-up's configuration and five raced, eighteen not
    runs = {c["name"]: ["v15", *(["sdpa_auto"] if c in raced else [])] for c in others}
    named = {f"{n}.{c['name']}" for c in others for n in runs[c["name"]]}
    expected = Expected(**{**records.EXPECTED.__dict__,
                           "peers": [*(p["name"] for p in records.PEERS), *(n for n in named if n.startswith("sdpa"))],
                           "causal": [*(n for n in named if n.split(".")[1] in {c["name"] for c in others
                                                                                if c["mask"] == "causal"}),
                                      *(c["name"] for c in others if c["mask"] == "causal")],
                           "head_dims": {n: c["D"] for c in others for n in named if n.endswith(f".{c['name']}")
                                         and c["D"] != 128},
                           "configuration_head_dims": {c["name"]: c["D"] for c in others if c["D"] != 128}})
    contestants = {"dense": {"v15": 450.0, "v14": 400.0, "sdpa_auto": 430.0},
                   **{c["name"]: ({f"v15.{c['name']}": 380.0, f"sdpa_auto.{c['name']}": 330.0} if c in raced else {})
                      for c in others}}
    halving = {c["name"]: halved for c in raced if c["mask"] == "causal"}
    archive = write_archive(tmp_path, monkeypatch, [(c, runs[c["name"]]) for c in others],
                            {**TFLOPS, **{n: 380.0 for n in named}}, contestants, expected, halving, asks=asks)
    table = pd.read_csv(archive / "head_to_head.csv")
    assert set(table.config) == {"dense", *(c["name"] for c in raced)}
    assert set(table[table.config != "dense"].method) == {"graph"} and "step" in set(table[table.config == "dense"].method)
    reports = tmp_path / "reports"
    gpu_reports.render(archive, reports, ROOT / "workflow" / "templates" / "report.md.j2", "nvidia-h200", shipped.goal)
    hopper = (reports / "hopper.md").read_text()
    goals = hopper.split("# The goals in every configuration")[1]
    rows = {line.split(" |")[0].removeprefix("| ").split(" (")[0]: line for line in goals.splitlines()
            if line.startswith("| ") and not line.startswith("| configuration")}
    assert list(rows) == [c.name for c in shipped.configurations]
    for c in [first, *others]:  # the goal judged from the head-to-head where raced (v15 ahead of its stand-in)
        assert ("| v15 | reached |" if c is first or c in raced else "| v15 | not asked (no rivals) |") in rows[c["name"]]
    for c in others:
        assert f"# The line in the configuration {c['name']} (" in hopper, c["name"]
    for name in ("hopper_tflops.png", "hopper_sweep.png"):
        assert (reports / name).stat().st_size > 10_000, name
