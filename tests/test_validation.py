"""Every record is checked as it is read: a damaged, misplaced or edited one is one line naming its file
and key, and nothing is summarized from it. The committed archive passes as it is."""
import re

import pytest

from flashbench import FlashbenchError, validation
from flashbench.cli import main
from flashbench.files import read_json, write_json
from flashbench.summary import tidy_tables

import records
from records import edit, gather
from conftest import ROOT, made_once, shipped_settings

TFLOPS = {"v11": 140.0, "v12": 210.0, "v13": 220.0, "br128": 190.0, "hybrid_smem": 221.0}
ARCHIVED = sorted(p.parent for p in (ROOT / "results").glob("*/summary.csv"))
RUN_KINDS = ("check", "bench", "sweep", "profile")


def run_settings(results_dir, settings):
    """The settings an archive's run read, as its kernels.json embeds them (today's where it does not):
    its records are held to what that run was asked to do."""
    from flashbench.config import validate

    meta = validation.read_record(results_dir / "kernels.json", "kernels")
    return validate(meta["settings"], check_sources=False) if "settings" in meta else settings


@pytest.mark.parametrize("results_dir", ARCHIVED, ids=lambda p: p.name)
def test_every_archived_record_passes_as_it_is(results_dir, settings):
    settings = run_settings(results_dir, settings)
    expected = validation.Expected.from_settings(settings)
    read = {kind: [validation.read_record(p, kind, expected) for p in sorted((results_dir / kind).glob("*.json"))]
            for kind in RUN_KINDS}
    names = archived_names(results_dir, settings)
    assert {kind: sorted(r["kernel"] for r in rs) for kind, rs in read.items() if kind != "profile"} == {
        kind: sorted(names) for kind in ("check", "bench", "sweep")}


def archived_names(results_dir, settings) -> list[str]:
    """The runs of kernels and peers an archive holds, in table order: config's, less only those of the
    last versions, added since the archive was made (until a GPU runs them)."""
    names = [k["name"] for k in validation.read_record(results_dir / "kernels.json", "kernels")["kernels"]]
    configured = [run.name for run in settings.runs()]
    versions = [k.name for k in settings.kernels if k.kind == "version"]
    newer = list(dict.fromkeys(settings.run(name).of for name in configured if name not in names))
    assert set(names) <= set(configured) and newer == versions[len(versions) - len(newer):]
    return names


@pytest.mark.parametrize("results_dir", ARCHIVED, ids=lambda p: p.name)
def test_the_archived_tables_are_what_its_records_summarize_to(results_dir, settings, tmp_path):
    """Through the validation: the archive's records summarize to its tables exactly. Its builds are not
    archived, so each compile record is rebuilt from its row of resources.csv."""
    import pandas as pd

    settings = run_settings(results_dir, settings)
    compiled = []
    for r in pd.read_csv(results_dir / "resources.csv").to_dict("records"):
        path = tmp_path / r["arch"] / f"{r['kernel']}.json"
        write_json(path, {**{k: r[k] for k in ("kernel", "arch", "nvcc", "command", "cubin_sha256", "registers",
                                              "spill_store_bytes", "spill_load_bytes", "stack_frame_bytes",
                                              "static_smem_bytes", "smem_bytes", "blocks_per_sm")},
                          "source": str(ROOT / settings.kernel(settings.run(r["kernel"]).of).source),
                          "limited_by": r["limited_by"].split(" + "),
                          "launch": {k: r[k] for k in ("threads", "block_rows", "dynamic_smem_bytes")}})
        compiled.append(path)
    names = archived_names(results_dir, settings)
    kernels = [e for e in settings.entries() if e["name"] in names]

    def paths(kind, of=names):
        return [results_dir / kind / f"{name}.json" for name in of]

    tables = tidy_tables(kernels, paths("check"), paths("bench"), compiled, "sm_90", settings.case.as_dict(),
                         paths("sweep"), paths("profile", [k.name for k in settings.kernels if k.name in names]),
                         {"baseline": settings.baseline, "sweep": settings.sweep, "profile_note": None},
                         expected=validation.Expected.from_settings(settings))
    for table, name in zip(tables, ("summary.csv", "resources.csv", "profile.csv")):
        archived = pd.read_csv(results_dir / name, nrows=0).columns
        # a column added since the archive was made (the dispatch readings) is not in its records either
        assert all(table[c].isna().all() for c in table.columns if c not in archived), name
        table = table[[c for c in table.columns if c in archived]]
        assert table.to_csv(index=False) == (results_dir / name).read_text(), name


def path_of(paths, kind, name):
    return next(p for p in paths[kind] if p.stem == name)


def fail_a_shape(check):
    check["shapes"][3] = records.check_row(records.EXTRA, "late_max", passed=False)


def retime(bench, shape, steps):
    bench["timing"] = records.timing(210.0, shape=shape, counts={**records.BENCH, "steps": steps})


def one_shape_fewer(check):
    del check["shapes"][2]


BAD = [  # (kind, name, edit, message after "<path>: ")
    ("benches", "v12", lambda r: r.pop("cubin_sha256"), "key 'cubin_sha256': missing"),
    ("benches", "v12", lambda r: r.pop("provenance"), "key 'provenance': missing"),
    ("checks", "v12", lambda r: r.pop("provenance"), "key 'provenance': missing"),
    ("checks", "sdpa_auto", lambda r: r.pop("torch"), "key 'torch': missing"),
    ("benches", "unfused", lambda r: r.pop("backend"), "key 'backend': missing"),
    ("sweeps", "v13", lambda r: r.pop("cubin_sha256"), "key 'cubin_sha256': missing"),
    ("profiles", "v13", lambda r: r.pop("provenance"), "key 'provenance': missing"),
    ("benches", "v12", lambda r: retime(r, {**records.CASE, "S": 2048}, 3),
     "key 'timing.S': 2048, but the case is S=1024"),
    ("benches", "v12", lambda r: retime(r, records.CASE, 3), "key 'timing.steps': 3, but the case is steps=100"),
    ("benches", "v12", lambda r: r["timing"].update(tflops=999.0),
     "key 'timing.tflops': 999.0 is not what ms_per_step"),
    ("benches", "v12", lambda r: r["timing"].update(tflops=-190.0),
     "key 'timing.tflops': -190.0 is less than or equal to the minimum of 0"),
    ("benches", "v12", lambda r: r["timing"].update(tflops=float("inf")), "key 'timing.tflops': inf is not a finite"),
    ("benches", "v12", lambda r: r["timing"].update(ms_median=float("nan")),
     "key 'timing.ms_median': nan is not a finite number"),
    ("benches", "v12", lambda r: r["timing"].update(ms_graph=0), "key 'timing.ms_graph': 0 is less than or equal"),
    ("checks", "v12", lambda r: r.update(kernel="v11"), "key 'kernel': 'v11', but the file is 'v12''s"),
    ("checks", "v12", fail_a_shape, "key 'shapes[3].passed': false (B=2 H=16 S=2048 D=128 late_max), but the record"),
    ("checks", "v12", one_shape_fewer, "key 'shapes': no row for the configured shape B=2 H=16 S=2048 D=128 on normal"),
    ("checks", "v12", lambda r: r["gate"].update(factor=4.0), "key 'gate': {'factor': 4.0, 'tolerance': 0.005}, but"),
    ("checks", "v12", lambda r: r["shapes"][0].update(passed=None), "key 'passed': true, but the case on normal"),
    ("sweeps", "v13", lambda r: r["points"].pop(), "key 'points': at S = [512, 1024], but the configured sweep is"),
    ("sweeps", "v13", lambda r: r["points"][1].update(repeats=7), "key 'points[1].repeats': 7, but the configured"),
    ("sweeps", "v13", lambda r: r["points"][1].update(H=32),
     "key 'points[1]': at B=1 H=32 S=1024 D=128, but the sweep runs at B=1 H=64 S=1024 D=128"),
    ("checks", "v12", lambda r: r.update(skipped="no GPU"), "key 'passed': true, but the check was skipped"),
    ("profiles", "v13", lambda r: r.update(S=2048), "key 'S': profiled at B=1 H=64 S=2048 D=128, but the case is"),
    ("compiled", "v13", lambda r: r.pop("cubin_sha256"), "key 'cubin_sha256': missing"),
    ("checks", "v12", lambda r: r["provenance"].update(gpu_uuid="0000:19:00.0"),
     "key 'provenance.gpu_uuid': '0000:19:00.0' does not match"),
]


@pytest.mark.parametrize("kind, name, change, message", BAD, ids=[f"{b[0]}-{b[1]}-{b[3][:40]}" for b in BAD])
def test_summarize_refuses_a_bad_record_naming_its_file_and_key(tmp_path, kind, name, change, message):
    paths = records.write(tmp_path, TFLOPS)
    gather(paths)  # as written: fine
    path = path_of(paths, kind, name)
    edit(path, change)
    with pytest.raises(validation.BadRecord) as raised:
        gather(paths)
    assert str(raised.value).startswith(f"{path}: {message}"), str(raised.value)
    assert "\n" not in str(raised.value)


def test_a_check_that_stopped_at_a_fault_is_summarized_and_reported_as_failed(tmp_path):
    from flashbench import archive_tables

    paths = records.write(tmp_path, TFLOPS, failing="v12")
    edit(path_of(paths, "checks", "v12"), lambda r: r.update(shapes=[{**r["shapes"][0], "fatal": True}]))
    summary, _, _, meta = gather(paths)
    assert next(k for k in meta["kernels"] if k["name"] == "v12")["check_passed"] is False
    summary.to_csv(tmp_path / "summary.csv", index=False)
    write_json(tmp_path / "kernels.json", meta)
    archive_tables.read_summary(tmp_path)  # one row of v12's, on one kind of input: whole as it is


def test_a_peer_is_named_by_its_torch_build_and_backend_whatever_else_its_library_names(tmp_path):
    paths = records.write(tmp_path, TFLOPS)
    for kind in ("checks", "benches", "sweeps"):  # as flash_attn_cute names itself: no cuDNN, its own packages
        edit(path_of(paths, kind, "sdpa_auto"), lambda r: r.pop("cudnn") and r.update(flash_attn="4.0.0"))
    gather(paths)


def test_a_record_cut_short_is_one_line_naming_it(tmp_path, capsys):
    paths = records.write(tmp_path, TFLOPS)
    check = path_of(paths, "checks", "v13")
    check.write_text(check.read_text()[:500])
    with pytest.raises(validation.BadRecord, match=f"^{check}: not valid JSON .* damaged or cut short"):
        gather(paths)


def test_timing_refuses_a_check_that_passed_though_a_shape_failed(tmp_path, capsys, records_settings):
    """bench and sweep take a check record's shapes over its `passed`, and refuse it before the GPU."""
    paths = records.write(tmp_path, TFLOPS)
    check = path_of(paths, "checks", "v12")
    edit(check, fail_a_shape)
    record = tmp_path / "build" / "sm_90" / "v12.json"
    record.with_suffix(".cubin").write_bytes(b"")  # its build: never read, the check refused first
    for stage in ("bench", "sweep"):
        out = tmp_path / f"{stage}.json"
        assert main([stage, *records_settings, "--cubin", str(record.with_suffix(".cubin")), "--record", str(record),
                     "--check", str(check), "--out", str(out)]) == 1
        err = capsys.readouterr().err
        assert err == f"error: {check}: key 'shapes[3].passed': false (B=2 H=16 S=2048 D=128 late_max), but the " \
                      f"record says the check passed\n"
        assert not out.exists()


def test_the_summarize_command_says_what_is_wrong_in_one_line(tmp_path, capsys, records_settings):
    paths = records.write(tmp_path, TFLOPS)
    bench = path_of(paths, "benches", "v12")
    edit(bench, lambda r: r.update(read_json(path_of(paths, "benches", "v13"))))
    args = ["summarize", *records_settings, "--gpu-arch", "sm_90", "--out-dir", str(tmp_path / "out")]
    for option, kind in (("--checks", "checks"), ("--benches", "benches"), ("--compiled", "compiled"),
                         ("--sweeps", "sweeps"), ("--profiles", "profiles")):
        args += [option, *map(str, paths[kind])]
    assert main(args) == 1
    assert capsys.readouterr().err == f"error: {bench}: key 'kernel': 'v13', but the file is 'v12''s\n"
    assert not (tmp_path / "out").exists()


def test_summarize_refuses_records_that_make_no_whole_archive_and_leaves_the_tables_as_they_were(
        tmp_path, capsys, records_settings, monkeypatch):
    """Every record kind given, but a head-to-head point, a cycle count or a kernel's profile left out: the
    tables would read back refused (or say a kernel was not profiled), so none is written."""
    import dataclasses

    from flashbench import cli, config

    # the synthetic run's settings are built directly (records.settings), not from a config the schema takes:
    # kernels.json embeds their archs, and its settings read back as them
    run = dataclasses.replace(records.settings(), mapping={"archs": records.settings().archs})
    monkeypatch.setattr(cli, "load_settings", lambda path: run)
    monkeypatch.setattr(config, "validate", lambda mapping, **_: run)
    kernels, contestants = records.KERNELS + records.HOPPER, {"v15": 450.0, "v14": 400.0, "sdpa_auto": 430.0}
    tflops = {**TFLOPS, **contestants}
    paths = records.write(tmp_path, tflops, kernels=kernels)
    shapes = [records.CASE, *({**records.CASE, "S": S} for S in records.SWEEP_S if S != records.CASE["S"])]
    for seed, shape in enumerate(shapes):
        write_json(tmp_path / "head_to_head" / f"S{shape['S']}.json",
                   {**records.head_to_head_record(shape, contestants, seed), "configuration": "dense", "causal": False})
    for k in kernels + records.PEERS:  # each counted as the build or peer its check ran
        check = read_json(tmp_path / "checks" / f"{k['name']}.json")
        count = records.cycles_record(k["name"], shapes if k["name"] in contestants else [records.CASE],
                                      tflops.get(k["name"], records.PEER_TFLOPS.get(k["name"])))
        write_json(tmp_path / "cycles" / f"{k['name']}.json",
                   {**count, **{f: check[f] for f in ("cubin_sha256", "torch", "cudnn", "backend") if f in check}})
    out = tmp_path / "out"

    def summarize(leaving_out=None):
        args = ["summarize", *records_settings, "--gpu-arch", "sm_90", "--out-dir", str(out)]
        for option, folder in (("--checks", "checks"), ("--benches", "benches"), ("--compiled", "build/*"),
                               ("--sweeps", "sweeps"), ("--profiles", "profiles"),
                               ("--head-to-heads", "head_to_head"), ("--cycles", "cycles")):
            args += [option, *(str(p) for p in sorted(tmp_path.glob(f"{folder}/*.json")) if p != leaving_out)]
        return main(args)

    assert summarize() == 0
    capsys.readouterr()
    made = {p.name: p.read_bytes() for p in out.iterdir()}
    assert set(made) == {"summary.csv", "resources.csv", "profile.csv", "head_to_head.csv", "cycles.csv",
                         "kernels.json"}
    for left_out, said in (("head_to_head/S2048.json", "out/head_to_head.csv: line 14: no row for v15 against v14 by "
                                                      "step at S=2048, where kernels.json says both were run: cut "
                                                      "short or edited: the records given make no whole archive"),
                           ("cycles/v13.json", "out/cycles.csv: line 4: no row for v13 at the case, where kernels.json says "
                                              "it was counted"),
                           ("profiles/v14.json", "no profile record for v14: run its profile")):
        assert summarize(tmp_path / left_out) == 1
        err = capsys.readouterr().err
        assert said in err and len(err.splitlines()) == 1, (left_out, err)
        assert {p.name: p.read_bytes() for p in out.iterdir()} == made  # as they were
    from flashbench import archive_tables

    def unreadable(folder):  # a table just made that does not read back at all: named as in out, not staging
        raise validation.BadRecord(f"{folder / 'kernels.json'}: key 'settings': not settings a run could have read")

    monkeypatch.setattr(archive_tables, "read_tables", unreadable)
    assert summarize() == 1
    assert capsys.readouterr().err == (f"error: {out / 'kernels.json'}: key 'settings': not settings a run could have "
                                       f"read (the tables just made, so {out} is left as it was)\n")
    assert {p.name: p.read_bytes() for p in out.iterdir()} == made


def test_a_missing_check_record_is_named(tmp_path):
    paths = records.write(tmp_path, TFLOPS)
    paths["checks"] = [p for p in paths["checks"] if p.stem != "v12"]
    with pytest.raises(FlashbenchError, match="^no check record for v12: run its check$"):
        gather(paths)


# ---- the tables, read back by the reports ---------------------------------------------------------------

REPORT_TEMPLATE = ROOT / "workflow" / "templates" / "report.md.j2"
GOAL = shipped_settings().goal  # the Hopper report's
COMPARE_TEMPLATE = ROOT / "workflow" / "templates" / "compare.md.j2"


@pytest.fixture(scope="module")
def rendered_once(tmp_path_factory, worker_id):
    """A results folder and the reports rendered from it, as a run leaves them: rendered once for the
    test run (every worker's), for the tests below, which each damage a copy (rendered)."""
    from flashbench import gpu_comparison, gpu_reports

    def render(tmp):
        out = records.results_folder(tmp, TFLOPS)
        gpu_reports.render(out, tmp / "reports", REPORT_TEMPLATE, "nvidia-h200", GOAL)
        gpu_comparison.render([out], COMPARE_TEMPLATE, tmp / "reports" / "README.md", tmp / "reports" / "compare.png")

    tmp = made_once(tmp_path_factory, worker_id, "validation-rendered", render)
    return tmp / "results" / "nvidia-h200", tmp / "reports"


@pytest.fixture
def rendered(tmp_path, rendered_once):
    """A copy of rendered_once's results folder and reports, file times kept, for a test to damage."""
    import shutil

    out, reports = tmp_path / "results" / "nvidia-h200", tmp_path / "reports"
    shutil.copytree(rendered_once[0], out)
    shutil.copytree(rendered_once[1], reports)
    return out, reports


def refused_by_both(out, reports, message):
    """Neither report renders from `out`: one line naming the table, and what was rendered before stays."""
    from flashbench import gpu_comparison, gpu_reports

    before = {p.name: p.read_bytes() for p in reports.iterdir()}
    for render in (lambda: gpu_reports.render(out, reports, REPORT_TEMPLATE, "nvidia-h200", GOAL),
                   lambda: gpu_comparison.render([out], COMPARE_TEMPLATE, reports / "README.md", reports / "compare.png")):
        with pytest.raises(validation.BadRecord) as raised:
            render()
        assert message in str(raised.value) and "\n" not in str(raised.value), str(raised.value)
    assert {p.name: p.read_bytes() for p in reports.iterdir()} == before


def cut(path, keep: float):
    text = path.read_text()
    path.write_text(text[:int(len(text) * keep)])


@pytest.mark.parametrize("keep", [0.001, 0.33, 0.5, 0.97])  # in the header, in a case row, in the sweep rows
def test_a_summary_cut_short_is_refused(rendered, keep):
    out, reports = rendered
    cut(out / "summary.csv", keep)
    refused_by_both(out, reports, f"{out / 'summary.csv'}: its last line stops short: cut short")


@pytest.mark.parametrize("lines, message", [
    (10, "v12 has sweep rows at S = [], not at the sweep's S = [512, 1024, 2048]: cut short"),
    (49, "unfused has sweep rows at S = [512, 1024], not at the sweep's S = [512, 1024, 2048]: cut short"),
    (1, "v11 has no check rows: cut short"),
    (9, "v12 has no check rows on late_max inputs: cut short"),
])
def test_a_summary_cut_at_the_end_of_a_line_is_refused(rendered, lines, message):
    out, reports = rendered
    kept = (out / "summary.csv").read_text().splitlines(keepends=True)[:lines]
    (out / "summary.csv").write_text("".join(kept))
    refused_by_both(out, reports, f"{out / 'summary.csv'}: {message}")


def test_a_kernels_json_cut_short_is_refused(rendered):
    out, reports = rendered
    cut(out / "kernels.json", 0.5)
    refused_by_both(out, reports, f"{out / 'kernels.json'}: not valid JSON")


def edit_case_row(out, column, value, kernel="v12"):
    import pandas as pd

    summary = pd.read_csv(out / "summary.csv")
    case = (summary.kernel == kernel) & (summary.series == "check") & summary.is_case & (summary.inputs == "normal")
    summary.loc[case, column] = value
    summary.to_csv(out / "summary.csv", index=False)


@pytest.mark.parametrize("column, value, message", [
    ("tflops", -190.0, "tflops -190.0 is not a positive finite number"),
    ("tflops", float("inf"), "tflops inf is not a positive finite number"),
    ("tflops", 0.0, "tflops 0.0 is not a positive finite number"),
    ("tflops", 1e300, "tflops 1e+300 is not what ms_per_step"),
    ("tflops", float("nan"), "tflops is empty though tflops_median is not"),
    ("ms_graph", 1e-300, "tflops_graph"),
])
def test_a_summary_with_an_impossible_timing_is_refused(rendered, column, value, message):
    out, reports = rendered
    edit_case_row(out, column, value)
    refused_by_both(out, reports, message)


def test_a_summary_must_agree_with_kernels_json(rendered):
    out, reports = rendered
    meta = read_json(out / "kernels.json")
    v12 = next(k for k in meta["kernels"] if k["name"] == "v12")
    v12["timing"] = records.timing(300.0)
    write_json(out / "kernels.json", meta)
    refused_by_both(out, reports, "v12's TFLOPS at the case is 210.0, but kernels.json says 300.0")


def test_a_row_of_a_kernel_kernels_json_does_not_list_is_refused(rendered):
    out, reports = rendered
    import pandas as pd

    summary = pd.read_csv(out / "summary.csv")
    summary.loc[summary.kernel == "v12", "kernel"] = "<img src=x onerror=alert(1)>"
    summary.to_csv(out / "summary.csv", index=False)
    refused_by_both(out, reports, "<img src=x onerror=alert(1)> is not among the kernels of kernels.json")


def test_a_point_timed_otherwise_than_its_configuration_asks_is_to_be_run_again(tmp_path):
    """config's head-to-head times dense's points back to back and by graph, causal's by graph alone: a
    causal point that timed both (a record from before, none of its methods named) is refused, naming
    what to do, and one of the graph alone is read."""
    from flashbench.validation import BadRecord, Expected, read_record

    expected = Expected.from_settings(shipped_settings())
    assert expected.head_to_head_methods["dense"] == ["step", "graph"] and expected.head_to_head_methods["causal"] == ["graph"]
    path = tmp_path / "S1024.causal.json"
    for back_to_back in (True, False):
        point = records.head_to_head_record(records.CASE, {"v25.causal": 380.0, "sdpa_cudnn.causal": 330.0}, 0,
                                            back_to_back)
        write_json(path, {**point, "configuration": "causal", "causal": True})
        if back_to_back:
            with pytest.raises(BadRecord, match=r"key 'methods': \['step', 'graph'\], but config's head-to-head times "
                                                r"\['graph'\] in the configuration causal: run its head-to-head again"):
                read_record(path, "head_to_head", expected)
        else:
            assert read_record(path, "head_to_head", expected)["methods"] == ["graph"]


def test_a_head_to_head_whose_order_or_case_flag_disagrees_with_itself_is_refused(tmp_path):
    from flashbench.validation import BadRecord, read_record

    path = tmp_path / "S1024.json"
    point = records.head_to_head_record(records.CASE, {"v15": 590.0, "sdpa_auto": 560.0}, seed=0)
    write_json(path, {**point, "order": ["sdpa_auto", "v15"]})
    with pytest.raises(BadRecord, match=r"key 'order': \['sdpa_auto', 'v15'\], but the contestants are \['v15', "
                                        r"'sdpa_auto'\]$"):
        read_record(path, "head_to_head", records.EXPECTED)
    write_json(path, {**point, "is_case": False})
    with pytest.raises(BadRecord, match=r"key 'is_case': False, but B=1 H=64 S=1024 D=128 is the case$"):
        read_record(path, "head_to_head", records.EXPECTED)


def test_a_head_to_head_whose_rounds_are_not_paired_or_a_count_without_the_case_is_refused(tmp_path):
    from flashbench.validation import BadRecord, read_record

    point = records.head_to_head_record(records.CASE, {"v15": 590.0, "sdpa_auto": 560.0}, seed=0)
    path = tmp_path / "S1024.json"
    write_json(path, point)
    assert read_record(path, "head_to_head", records.EXPECTED)["is_case"]
    point["contestants"]["v15"]["rounds"].pop()
    write_json(path, point)
    with pytest.raises(BadRecord, match="key 'contestants': rounds differ between contestants"):
        read_record(path, "head_to_head", records.EXPECTED)
    point = records.head_to_head_record(records.CASE, {"v15": 590.0, "sdpa_auto": 560.0}, seed=0, back_to_back=False)
    write_json(path, point)
    assert read_record(path, "head_to_head", records.EXPECTED)["methods"] == ["graph"]
    for method_said, what in (([], r"key 'methods': \[\] should be non-empty"),
                              (["step"], r"key 'methods': \['step'\] does not contain"),
                              (None, r"key 'contestants\.sdpa_auto\.rounds\[0\]\.step_s': missing")):  # none: both
        changed = {**point, "methods": method_said} if method_said is not None else \
            {k: v for k, v in point.items() if k != "methods"}
        write_json(path, changed)
        with pytest.raises(BadRecord, match=what):
            read_record(path, "head_to_head", records.EXPECTED)
    import copy

    for figures in ({"step_s": 1e-3, "issue_s": 1e-4, "dispatch_bound": False}, {"issue_s": 1e-4},
                    {"dispatch_bound": False}, {"clocks": {**point["contestants"]["v15"]["rounds"][0]["clocks"],
                                                           "step": {"samples": 0}}}):
        back_to_back = copy.deepcopy(point)  # a round's back-to-back figures in a point of the graph alone
        back_to_back["contestants"]["v15"]["rounds"][0].update(figures)
        write_json(path, back_to_back)
        with pytest.raises(BadRecord, match=r"key 'contestants\.v15\.rounds\[0\](\.clocks)?': False schema does not allow"):
            read_record(path, "head_to_head", records.EXPECTED)
    point["contestants"]["v15"]["step_calls_per_timing"] = 100
    write_json(path, point)
    with pytest.raises(BadRecord, match=r"key 'contestants\.v15': False schema does not allow 100"):
        read_record(path, "head_to_head", records.EXPECTED)
    counts = records.cycles_record("v15", [{**records.CASE, "S": 2048}], 590.0)
    write_json(tmp_path / "v15.json", counts)
    with pytest.raises(BadRecord, match="key 'points': no count at the case"):
        read_record(tmp_path / "v15.json", "cycles", records.EXPECTED)
    counts["points"][0]["cycles"] = -1.0
    write_json(tmp_path / "v15.json", counts)
    with pytest.raises(BadRecord, match=r"key 'points\[0\]\.cycles'"):
        read_record(tmp_path / "v15.json", "cycles")


def test_the_settings_kernels_json_embeds_read_back_as_settings_and_agree_with_it(tmp_path):
    """kernels.json embeds the validated config its run read; read back through config.Settings it must
    be settings a run could have read, and say what kernels.json says of the run."""
    from flashbench import config

    meta = read_json(ROOT / "results" / "nvidia-h200" / "kernels.json")
    today = meta.get("settings") or config.read(ROOT / "config.yaml")  # the settings the archive's run read
    path = tmp_path / "kernels.json"
    write_json(path, {**meta, "settings": today})
    assert validation.read_record(path, "kernels")["settings"]["headline"] == meta["headline"]
    for change, message in ((lambda s: s.update(headline=["v23"]),
                             re.escape(f"key 'headline': {meta['headline']}, but the settings it embeds say ['v23']")),
                            (lambda s: s.pop("case"), "key 'settings': not settings a run could have read: "
                                                      "config key 'case': missing")):
        settings = dict(today)
        change(settings)
        write_json(path, {**meta, "settings": settings})
        with pytest.raises(validation.BadRecord, match=message):
            validation.read_record(path, "kernels")


def test_a_kernels_check_must_have_run_on_its_own_kinds_too(tmp_path):
    """A kernel's check record names check.inputs and check.kernel_inputs, a peer's check.inputs alone;
    one that left out far_max is refused."""
    import dataclasses

    expected = dataclasses.replace(records.EXPECTED, kernel_inputs=["far_max"])
    shapes = [records.check_row(s, kind, True) for s in (records.CASE, records.EXTRA) for kind in records.INPUTS]
    kernel = {"kernel": "v11", "gate": records.GATE, "inputs": records.INPUTS, "passed": True, "reason": None,
              "shapes": shapes, "cubin_sha256": "a" * 64, "provenance": records.provenance("v11")}
    write_json(tmp_path / "v11.json", kernel)
    with pytest.raises(validation.BadRecord, match=r"key 'inputs': \['normal', 'late_max'\], but the configured kinds "
                                                   r"of input are \['normal', 'late_max', 'far_max'\]"):
        validation.read_record(tmp_path / "v11.json", "check", expected)
    more = [records.check_row(s, "far_max", True) for s in (records.CASE, records.EXTRA)]
    write_json(tmp_path / "v11.json", {**kernel, "inputs": [*records.INPUTS, "far_max"], "shapes": shapes + more})
    validation.read_record(tmp_path / "v11.json", "check", expected)
    peer = {**kernel, "kernel": "sdpa_auto", "torch": "2.11", "backend": "auto"}
    del peer["cubin_sha256"]
    write_json(tmp_path / "sdpa_auto.json", peer)
    validation.read_record(tmp_path / "sdpa_auto.json", "check", expected)  # a peer: check.inputs alone


def test_a_run_at_another_head_dim_is_held_to_its_own_shapes(tmp_path):
    """A run of a configuration at D=64 (Expected.head_dims) checks, and is timed and counted, at the
    configured shapes at D=64: its record at D=64 passes, the same shapes at the case's D do not, and
    the first configuration's runs keep the case's D."""
    import dataclasses

    expected = dataclasses.replace(records.EXPECTED, head_dims={"v11.d64": 64}, configuration_head_dims={"d64": 64})
    assert expected.case_of("v11.d64") == {**records.CASE, "D": 64} and expected.case_of("v11") == records.CASE
    assert expected.case_in("d64")["D"] == 64 and expected.case_in(None) == records.CASE
    at_64 = [{**s, "D": 64} for s in (records.CASE, records.EXTRA)]
    shapes = [records.check_row(s, kind, True) for s in at_64 for kind in records.INPUTS]
    check = {"kernel": "v11.d64", "gate": records.GATE, "inputs": records.INPUTS, "passed": True, "reason": None,
             "shapes": shapes, "cubin_sha256": "a" * 64, "provenance": records.provenance("v11.d64")}
    write_json(tmp_path / "v11.d64.json", check)
    validation.read_record(tmp_path / "v11.d64.json", "check", expected)
    at_case = [records.check_row(s, kind, True) for s in (records.CASE, records.EXTRA) for kind in records.INPUTS]
    write_json(tmp_path / "v11.d64.json", {**check, "shapes": at_case})
    with pytest.raises(validation.BadRecord, match="key 'shapes': no row for the configured shape .*D=64"):
        validation.read_record(tmp_path / "v11.d64.json", "check", expected)
    counts = records.cycles_record("v11.d64", [records.CASE], 590.0)
    write_json(tmp_path / "v11.d64.json", counts)
    with pytest.raises(validation.BadRecord, match="key 'points': no count at the case .*D=64"):
        validation.read_record(tmp_path / "v11.d64.json", "cycles", expected)
    write_json(tmp_path / "v11.d64.json", {**records.cycles_record("v11.d64", at_64[:1], 590.0), "cubin_sha256": "a" * 64})
    validation.read_record(tmp_path / "v11.d64.json", "cycles", expected)


def test_a_sweep_runs_its_ragged_lengths_after_the_others(tmp_path):
    """sweep.ragged: a sweep record's lengths are sweep.S, then the ragged ones (untimed where the
    kernel takes whole tiles only, with its reason)."""
    import dataclasses

    expected = dataclasses.replace(records.EXPECTED, sweep={**records.SWEEP, "ragged": [1000]})
    points = [{**records.timing(200.0, shape={**records.CASE, "S": S},
                                counts={**records.SWEEP, "steps": records.sweep_steps(records.SWEEP["steps"], 1024, S)}),
               "timed": True, "reason": None} for S in records.SWEEP_S]
    sweep = {"kernel": "v11", "timed": True, "reason": None, "cubin_sha256": "a" * 64, "points": points,
             "provenance": records.provenance("v11")}
    write_json(tmp_path / "v11.json", sweep)
    with pytest.raises(validation.BadRecord, match=r"key 'points': at S = \[512, 1024, 2048\], but the configured "
                                                   r"sweep is S = \[512, 1024, 2048, 1000\]"):
        validation.read_record(tmp_path / "v11.json", "sweep", expected)
    ragged = {**records.CASE, "S": 1000, "timed": False, "reason": "S=1000 is not a multiple of v11's block_rows (32)"}
    write_json(tmp_path / "v11.json", {**sweep, "points": [*points, ragged]})
    validation.read_record(tmp_path / "v11.json", "sweep", expected)


def test_a_sweeps_ragged_pair_is_of_a_configured_ragged_length_and_the_next_multiple_of_128_both_timed(tmp_path):
    """A headline version's sweep pairs each ragged S with the next multiple of 128 (both timed in the
    same sweep), in the head-to-head's rounds; a pair at another S or against another length, in other
    rounds, missing, or in the sweep of a run that pairs none, is refused."""
    import dataclasses

    expected = dataclasses.replace(records.EXPECTED, sweep={**records.SWEEP, "S": [512, 1024], "ragged": [1000]},
                                   ragged_pairs=["v11"], ragged_rounds=4)
    points = [{**records.timing(200.0, shape={**records.CASE, "S": S},
                                counts={**records.SWEEP, "steps": records.sweep_steps(records.SWEEP["steps"], 1024, S)}),
               "timed": True, "reason": None} for S in (512, 1024, 1000)]
    pair = {"S": 1000, "near": 1024, "causal": False, "calls_per_timing": {"1000": 9, "1024": 9},
            "rounds": [{"graph_s": 1e-4, "near_graph_s": 1.05e-4}] * 4}
    sweep = {"kernel": "v11", "timed": True, "reason": None, "cubin_sha256": "a" * 64, "points": points,
             "provenance": records.provenance("v11"), "ragged": [pair]}
    write_json(tmp_path / "v11.json", sweep)
    validation.read_record(tmp_path / "v11.json", "sweep", expected)
    for damaged, said in (([{**pair, "near": 1152}], r"ragged\[0\].near': 1152, but S=1000 is paired with .* 1024"),
                          ([{**pair, "S": 900}], r"pairs at S = \[900\], but the sweep timed S = \[1000\]"),
                          ([], r"pairs at S = \[\], but the sweep timed S = \[1000\]"),
                          ([pair, pair], r"pairs at S = \[1000, 1000\]"),
                          ([{**pair, "rounds": pair["rounds"][:3]}], r"rounds': 3, but the pair is timed in 4"),
                          ([{**pair, "calls_per_timing": {"1000": 9}}], "calls_per_timing"),
                          ([{**pair, "rounds": [{"graph_s": 0.0, "near_graph_s": 1e-4}] * 4}], "graph_s"),
                          ([{**pair, "causal": True}], "ragged\\[0\\].causal")):
        write_json(tmp_path / "v11.json", {**sweep, "ragged": damaged})
        with pytest.raises(validation.BadRecord, match=said):
            validation.read_record(tmp_path / "v11.json", "sweep", expected)
    write_json(tmp_path / "v11.json", sweep)
    with pytest.raises(validation.BadRecord, match="1 pair\\(s\\), but v11's sweep pairs no ragged length"):
        validation.read_record(tmp_path / "v11.json", "sweep", dataclasses.replace(expected, ragged_pairs=[]))
    write_json(tmp_path / "v11.json", {**sweep, "ragged": [],
                                       "points": [*points[:2], {**points[2], "timed": False, "reason": "no"}]})
    validation.read_record(tmp_path / "v11.json", "sweep", expected)  # 1000 untimed: nothing to pair


def test_kernels_json_holds_a_ragged_pair_to_the_rounds_its_sweep_timed_it_in(tmp_path):
    """A headline version's ragged pair in kernels.json has the rounds of sweep.ragged_pair, or of the
    head-to-head in an archive from before that key; one of other rounds is refused."""
    meta = read_json(ROOT / "results" / "nvidia-h200" / "kernels.json")
    paired = next(k for k in meta["kernels"] if k.get("ragged"))
    rounds = len(paired["ragged"][0]["rounds"])
    path = tmp_path / "kernels.json"

    def timed_in(pair_rounds: int | None, head_to_head_rounds: int) -> dict:
        sweep = {k: v for k, v in meta["sweep"].items() if k != "ragged_pair"}
        if pair_rounds:
            sweep["ragged_pair"] = {"rounds": pair_rounds, "warmup": 10, "min_timing_ms": 1000, "lead_in_ms": 100}
        h2h = {**meta["head_to_head"], "rounds": head_to_head_rounds}
        return {**meta, "sweep": sweep, "head_to_head": h2h, "settings": {**meta["settings"], "sweep": sweep,
                                                                          "head_to_head": h2h}}

    write_json(path, timed_in(rounds, rounds + 5))
    validation.read_record(path, "kernels")
    write_json(path, timed_in(rounds + 1, rounds))
    with pytest.raises(validation.BadRecord, match=rf"ragged\[0\]\.rounds': {rounds}, but the pair is timed in {rounds + 1}"):
        validation.read_record(path, "kernels")
    write_json(path, timed_in(None, rounds + 5))  # without the key, the head-to-head's rounds are the pair's
    with pytest.raises(validation.BadRecord, match=rf"ragged\[0\]\.rounds': {rounds}, but the pair is timed in {rounds + 5}"):
        validation.read_record(path, "kernels")
