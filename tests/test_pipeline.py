"""The Snakemake DAG (dry runs) and the no-GPU behaviour of the command line."""
import json
import os
import re
import shutil
import subprocess
import sys
import time
import zipfile

import pytest

from flashbench import gpu

from browser import CHROMIUM, Browser
from conftest import ROOT, a_gpu_here, copy_checkout, made_once, snakemake, with_build, with_stub

pytestmark = pytest.mark.usefixtures("needs_nvcc")


@pytest.fixture
def checkout(tmp_path):
    """The workflow alone: no build/, results/ or reports/."""
    return copy_checkout(tmp_path)


@pytest.fixture
def built_checkout(checkout, built):
    """A fresh clone after `snakemake compile`."""
    return with_build(checkout, built)


@pytest.fixture
def with_ncu(tmp_path):
    """An environment where an `ncu` is found on PATH (a stub: dry runs never call it)."""
    return with_stub(tmp_path, "ncu", "exit 0")


PROFILING_HERE = shutil.which("ncu") is not None


def job_counts(stdout: str) -> dict:
    table = stdout.split("Job stats:")[1].split("total")[0]
    return {m[1]: int(m[2]) for m in re.finditer(r"^(\w+)\s+(\d+)$", table, re.M)}


H200 = ("--config", "gpu=nvidia-h200", "gpu_arch=sm_90")  # GPU mode on any machine, for dry runs


def builds(settings, archs: int) -> int:
    """Compile jobs: per kernel and configuration it runs in, `archs` for a kernel built for the global
    archs, one per own arch for the others."""
    return sum((len(k.archs) if k.archs else archs) * len(k.configurations) for k in settings.kernels)


def test_dry_run_with_a_gpu_lists_every_stage(checkout, settings, with_ncu):
    proc = snakemake(checkout, "-n", *H200, env=with_ncu)
    assert proc.returncode == 0, proc.stderr
    # every kernel build and peer run in each configuration it runs in; the profile in the first
    n, peers = len(settings.kernel_builds()), len(settings.peer_runs())
    # the head-to-head in each configuration with rivals (the bf16 twins and grouped K/V heads under the mask
    # have none: their headline counted alone)
    raced = [c for c in settings.configurations if settings.rivals_in(c)]
    assert [c.name for c in raced] == ["dense", "causal", "bf16", "gqa", "d64", "d256"]
    assert all(settings.headline_in(c) for c in settings.configurations)
    assert job_counts(proc.stdout) == {"compile_kernel": builds(settings, 2), "check_kernel": n,
                                       "bench_kernel": n, "sweep_kernel": n, "profile_kernel": len(settings.kernels),
                                       "check_peer": peers, "bench_peer": peers, "sweep_peer": peers, "summarize": 1,
                                       "render_report": 1, "compare_gpus": 1, "report_pages": 1, "comparison_page": 1,
                                       "report": 1, "head_to_head_point": sum(len(settings.headline_shapes(c)) for c in raced),
                                       "cycles_kernel": n, "cycles_peer": peers}
    for name in ("v11", "v12", "v13", "br128", "hybrid_smem", "sdpa_auto", "sdpa_flash", "unfused"):
        assert f"results/nvidia-h200/bench/{name}.json" in proc.stdout
        assert f"results/nvidia-h200/sweep/{name}.json" in proc.stdout
    assert "results/nvidia-h200/profile/v12.json" in proc.stdout
    assert "reports/nvidia-h200/report.md" in proc.stdout and "reports/nvidia-h200/sweep.png" in proc.stdout
    for point in ("S1024", "S2048", "S16384", "S1024.causal", "S16384.causal", "S4096.bf16", "S4096.gqa", "S4096.d64"):
        assert f"results/nvidia-h200/head_to_head/{point}.json" in proc.stdout
    assert "results/nvidia-h200/head_to_head/S512.json" not in proc.stdout  # below every goal's S
    for run in ("v25.causal", "sdpa_cudnn.causal", "flash_attn_cute.causal", "v25.bf16", "flash_attn_cute.gqa",
                "v25.causal_bf16", "v25.d256_bf16", "v25.gqa_causal", "v25.gqa_causal_bf16"):
        assert all(f"results/nvidia-h200/{stage}/{run}.json" in proc.stdout for stage in ("bench", "sweep", "cycles"))
    assert "results/nvidia-h200/cycles/flash_attn_cute.json" in proc.stdout
    assert "head_to_head/S1024.causal_bf16.json" not in proc.stdout
    assert "results/nvidia-h200/head_to_head.csv" in proc.stdout and "results/nvidia-h200/cycles.csv" in proc.stdout


def test_a_configured_gpu_that_is_not_the_one_here_is_an_error_before_any_job(checkout, tmp_path):
    env = a_gpu_here(tmp_path)
    proc = snakemake(checkout, "-n", "--config", "gpu=nvidia-b300", env=env)
    assert proc.returncode != 0
    assert "config key 'gpu': 'nvidia-b300', but the GPU here is NVIDIA H200 (nvidia-h200)" in proc.stdout + proc.stderr
    assert "Job stats" not in proc.stdout
    assert snakemake(checkout, "-n", "--config", "gpu=nvidia-h200", env=env).returncode == 0


def test_a_kernels_gpu_jobs_wait_for_its_build(checkout, settings):
    """Compile is a checkpoint: before a kernel's build is done, each of its GPU jobs stands on that
    build (Snakemake decides it again, by content, once the build is done); a peer's needs none."""
    proc = snakemake(checkout, "-n", "-c1", *H200)
    assert proc.returncode == 0, proc.stderr
    assert len(re.findall(r"^checkpoint compile_kernel:", proc.stdout, re.M)) == builds(settings, 2)
    jobs = re.findall(r"^rule (\w+):\n(?:.*\n)*?\s+reason: (.*)\n\s+wildcards: (?:\w+=\w+, )*(?:build|kernel|peer)=([\w.]+)",
                      proc.stdout, re.M)
    kernel_jobs = [(rule, reason, name) for rule, reason, name in jobs if rule.endswith("_kernel")]
    assert {rule for rule, _, _ in kernel_jobs} == {"check_kernel", "bench_kernel", "sweep_kernel"}
    for rule, reason, name in kernel_jobs:  # its own build, and no other kernel's
        arch = "sm_90a" if settings.kernel(settings.run(name).of).archs == ["sm_90a"] else "sm_90"
        waits_for = set(re.findall(r"build/\w+/[\w.]+\.(?:cubin|json)", reason))
        assert waits_for and waits_for <= {f"build/{arch}/{name}.cubin", f"build/{arch}/{name}.json"}, (rule, reason)
    assert all("build/" not in reason for rule, reason, _ in jobs if rule.endswith("_peer"))


def test_without_ncu_the_profile_is_skipped_and_said_so(checkout, settings, with_ncu, tmp_path):
    without = {**with_ncu, "PATH": with_ncu["PATH"].split(os.pathsep, 1)[1]}
    if shutil.which("ncu", path=without["PATH"]):
        pytest.skip("an ncu is installed here")
    proc = snakemake(checkout, "-n", *H200, env=without)
    assert "profile_kernel" not in job_counts(proc.stdout)
    proc = snakemake(checkout, "profile", *H200, env=a_gpu_here(tmp_path))  # a GPU here, no ncu
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


NO_GPU = pytest.mark.skipif(gpu.detect() is not None, reason="a GPU is here")
ARCHIVED = sorted(p.parent.name for p in (ROOT / "results").glob("*/summary.csv"))


def with_archive(checkout):
    """`checkout` with the archived results/ and reports/, the reports older than the results (as
    after an edit of the template, or where a clone's file times fall so): every report is due."""
    for name in ("results", "reports"):
        shutil.copytree(ROOT / name, checkout / name)
    long_ago = time.time() - 86400
    for path in (checkout / "reports").rglob("*"):
        os.utime(path, (long_ago, long_ago))
    return checkout


@NO_GPU
def test_without_a_gpu_report_compiles_and_rerenders_the_archive(checkout, settings):
    proc = snakemake(with_archive(checkout), "-n")
    assert proc.returncode == 0, proc.stderr
    assert job_counts(proc.stdout) == {"compile_kernel": builds(settings, 2), "render_report": len(ARCHIVED),
                                       "compare_gpus": 1, "report_pages": len(ARCHIVED), "comparison_page": 1,
                                       "report": 1}
    folders = f"{len(ARCHIVED)} archived GPU folder{'' if len(ARCHIVED) == 1 else 's'} ({', '.join(ARCHIVED)})"
    assert f"no NVIDIA GPU found: `snakemake report` compiles the kernels and brings the reports of {folders} up to date;" \
        in proc.stderr


@pytest.fixture(scope="session")
def reported(tmp_path_factory, worker_id, built):
    """A clone after `snakemake compile`, every archived report due, then `snakemake report` (no
    GPU): the checkout and that run, made once for every test worker."""
    def report(checkout):
        run = snakemake(with_archive(with_build(copy_checkout(checkout), built)), "report")
        checkout.with_suffix(".run.json").write_text(json.dumps([run.returncode, run.stdout, run.stderr]))

    checkout = made_once(tmp_path_factory, worker_id, "reported", report)
    returncode, stdout, stderr = json.loads(checkout.with_suffix(".run.json").read_text())
    return checkout, subprocess.CompletedProcess(["snakemake", "report"], returncode, stdout, stderr)


@NO_GPU
def test_without_a_gpu_report_renders_what_is_due_and_then_nothing(reported):
    checkout, first = reported
    assert first.returncode == 0, first.stderr
    assert job_counts(first.stderr) == {"render_report": len(ARCHIVED), "compare_gpus": 1,
                                        "report_pages": len(ARCHIVED), "comparison_page": 1, "report": 1}
    for path in ["reports/README.md", *(f"reports/{slug}/{name}.md" for slug in ARCHIVED for name in ("report", "hopper"))]:
        assert (checkout / path).read_text() == (ROOT / path).read_text(), path
    # up to date means nothing to do: not a compile, not a render
    second = snakemake(checkout, "-n", "report")
    assert second.returncode == 0, second.stderr
    assert "Nothing to be done" in second.stdout and "Job stats" not in second.stdout


# build/pages/<gpu>/<name>.html; a table the archive's run did not make has a page saying so
PAGES = {"report": ["hopper", "report"], "tables": ["cycles", "head_to_head", "profile", "resources", "summary"]}
FIGURES = ["hopper_sweep", "hopper_tflops", "stalls", "sweep", "tflops"]  # reports/<gpu>/<name>.png


@NO_GPU
def test_snakemakes_html_report_holds_every_report_figure_and_table(reported):
    checkout, _ = reported
    proc = snakemake(checkout, "--report", "report.zip")
    assert proc.returncode == 0, proc.stderr
    archive = zipfile.ZipFile(checkout / "report.zip")
    html = archive.read("report/report.html").decode()
    # a category per archived GPU: its reports and tables as pages, its figures; the comparison under "all GPUs"
    categories = json.loads(re.search(r"var categories = (.*);\n", html)[1])
    per_gpu = {slug: {"report": [f"build/pages/{slug}/{name}.html" for name in PAGES["report"]],
                      "figures": [f"reports/{slug}/{name}.png" for name in FIGURES],
                      "tables": [f"build/pages/{slug}/{name}.html" for name in PAGES["tables"]]}
               for slug in ARCHIVED}
    assert categories == {**per_gpu, "all GPUs": {"report": ["build/pages/README.html"], "figures": ["reports/compare.png"]}}
    # every item one the viewer shows in the page (an image or HTML), as written
    results = json.loads(re.search(r"var results = (\{.*\});\n", html)[1])
    assert {path: entry["mime_type"] for path, entry in results.items()} == {
        path: "image/png" if path.endswith(".png") else "text/html"
        for files in (*per_gpu.values(), categories["all GPUs"]) for path in sum(files.values(), [])}
    held = {archive.read(name) for name in archive.namelist() if name.startswith("report/data/raw/")}
    for path in results:
        assert (checkout / path).read_bytes() in held, path
    assert "Every archived GPU side by side" in html
    for slug in ARCHIVED:
        assert f"TFLOPS of each kernel and PyTorch peer on {slug} at the case" in html


@pytest.fixture(scope="module")
def html_report(reported):
    """Snakemake's report of the `reported` checkout as one HTML file, every item embedded."""
    checkout, _ = reported
    proc = snakemake(checkout, "--report", "report.html")
    assert proc.returncode == 0, proc.stderr
    return checkout, checkout / "report.html"


SHOWN = """(() => {
    // what the eye button of an item does: an item shown in the page has a click handler, not a download
    const button = new ButtonViewManager(app).handleSelectedResult(%s);
    if (!button.props.onClick) return "offered as a download: " + button.props.download;
    button.props.onClick();
    return "shown";
})()"""

PAGE = """(() => ({
    title: document.title,
    text: document.body.innerText,
    images: Array.from(document.images).map(img => ({
        alt: img.alt, loaded: img.complete && img.naturalWidth > 0,
        width: img.getBoundingClientRect().width, height: img.getBoundingClientRect().height})),
    tables: Array.from(document.querySelectorAll("table")).map(table => ({
        header: Array.from(table.querySelectorAll("thead th")).map(th => th.innerText.trim()),
        rows: Array.from(table.querySelectorAll("tbody tr")).map(
            tr => Array.from(tr.querySelectorAll("td")).map(td => td.innerText.trim()))})),
}))()"""


def shown_in_the_report(browser, path: str) -> dict:
    """Click `path`'s eye button in report.html and read the page it shows: its title, figures (loaded,
    their size on screen) and tables."""
    assert browser.evaluate(SHOWN % json.dumps(path)) == "shown", path
    page = browser.evaluate(f"results[{json.dumps(path)}].data_uri")
    deadline = time.monotonic() + 20
    while not (frame := next((f for f in browser.frames() if f["url"] == page), None)):
        assert time.monotonic() < deadline, f"{path} is not shown in a frame"
        time.sleep(0.1)
    context = browser.context_of(frame["id"])
    browser.wait_for("document.readyState === 'complete' && Array.from(document.images).every(i => i.complete)",
                     context)
    return browser.evaluate(PAGE, context)


def tables_headed(page: dict, *columns: str) -> list[dict]:
    """The tables of `page` whose header starts with `columns`, in the page's order."""
    return [t for t in page["tables"] if t["header"][:len(columns)] == list(columns)]


def table_headed(page: dict, *columns: str) -> dict:
    """The one table of `page` whose header starts with `columns`."""
    found = tables_headed(page, *columns)
    assert len(found) == 1, (columns, [t["header"] for t in page["tables"]])
    return found[0]


@NO_GPU
@pytest.mark.skipif(CHROMIUM is None, reason="no chromium to open the report in (Debian: apt-get install chromium)")
def test_a_browser_shows_every_report_table_and_figure_in_the_page(html_report):
    checkout, report_html = html_report
    import pandas as pd

    with Browser() as browser:
        for slug in ARCHIVED:
            meta = json.loads((checkout / "results" / slug / "kernels.json").read_text())
            summary = pd.read_csv(checkout / "results" / slug / "summary.csv")
            case = summary[(summary.series == "check") & summary.is_case & summary.tflops.notna()]
            tflops = {r.kernel: f"{r.tflops:.1f}" for r in case.itertuples()}
            browser.open(report_html.as_uri())  # each page afresh, as a reader's click on it

            report = shown_in_the_report(browser, f"build/pages/{slug}/report.html")
            assert report["title"] == f"reports/{slug}/report.md"
            first = (meta.get("configurations") or [{"name": None}])[0]["name"]  # the chapter's configuration
            chapter = [k["name"] for k in meta["kernels"] if k.get("config") == first
                       and (k["kind"] == "peer" or k.get("line", "g3") == "g3")]
            table = table_headed(report, "kernel", "change", "TFLOPS (100-step)")
            assert [row[0].split()[0] for row in table["rows"]] == chapter  # "br128 (ablation of v13)"
            assert [row[2].split()[0] for row in table["rows"]] == [tflops[name] for name in chapter]
            assert [img["alt"] for img in report["images"]] == ["TFLOPS per kernel and peer", "TFLOPS against S",
                                                              "Warp stall reasons per kernel"]

            hopper = shown_in_the_report(browser, f"build/pages/{slug}/hopper.html")
            # a part per configuration, each naming its runs by their kernel or peer (v25.causal as v25)
            configurations = [c["name"] for c in meta.get("configurations") or [{"name": None}]]
            steps = tables_headed(hopper, "version", "change")
            assert len(steps) == len(configurations)
            for c, table in zip(configurations, steps):
                line = [k.get("of", k["name"]) for k in meta["kernels"] if k.get("line") == "hopper" and k.get("config") == c]
                assert [row[0] for row in table["rows"]] == line
            if (ROOT / "results" / slug / "head_to_head.csv").exists():  # the goal, judged head to head
                goals, marks = tables_headed(hopper, "where", "rival"), tables_headed(hopper, "at", "rival")
                points = pd.read_csv(ROOT / "results" / slug / "head_to_head.csv")
                raced = [c for c in configurations if not c or (points.config == c).any()]  # with a head-to-head
                assert len(goals) == len(raced) and 1 <= len(marks) <= len(raced)  # marks: where rivals' factors are asked
                for c, goal in zip(raced, goals):
                    mine = points[points.config == c] if c else points
                    headline = list(dict.fromkeys(mine.version))  # the configuration's headline runs, best first
                    best = mine[mine.version == headline[0]]
                    rivals = [r for r in dict.fromkeys(best.rival) if r not in headline]
                    pairs = best[best.rival.isin(rivals)][["S", "rival"]].drop_duplicates()  # one method or two
                    assert len(goal["rows"]) == len(pairs)  # a row per point and rival
                    assert all(re.fullmatch(r"\*?\*?\d+\.\d{2}\*?\*?", row[2]) for row in goal["rows"]), goal["rows"]
                assert all(mark["rows"] and all(row[-1] in ("yes", "no") for row in mark["rows"]) for mark in marks)
            else:
                assert "No head-to-head in this run" in hopper["text"]
            assert len(hopper["images"]) == 2

            for page in (report, hopper):
                for img in page["images"]:
                    assert img["loaded"] and img["width"] > 100 and img["height"] > 100, (page["title"], img)

            for name in PAGES["tables"]:
                page = shown_in_the_report(browser, f"build/pages/{slug}/{name}.html")
                if not (checkout / "results" / slug / f"{name}.csv").exists():
                    assert "Not in this archive" in page["text"] and not page["tables"], name
                    continue
                table = page["tables"]
                csv = pd.read_csv(checkout / "results" / slug / f"{name}.csv")
                assert len(table) == 1 and table[0]["header"] == list(csv.columns), name
                assert len(table[0]["rows"]) == len(csv), name

        browser.open(report_html.as_uri())
        comparison = shown_in_the_report(browser, "build/pages/README.html")
        rows = table_headed(comparison, "kernel")["rows"]  # the first configuration's runs: the case's
        first = (meta.get("configurations") or [{"name": None}])[0]["name"]
        assert len(rows) >= len([k for k in meta["kernels"] if k.get("config") == first])
        assert len(comparison["images"]) == 1
        assert comparison["images"][0]["loaded"] and comparison["images"][0]["width"] > 100


def _archs_here():
    here = gpu.detect()
    return {"sm_90", "sm_103"} | ({here.arch} if here else set())


@pytest.mark.parametrize("source, kernels", [("v11.cu", 1), ("v13.cu", 3)])  # v13.cu builds v13 and both ablations
def test_one_kernel_edit_reruns_only_its_jobs(built_checkout, source, kernels):
    checkout = built_checkout
    assert "Nothing to be done" in snakemake(checkout, "-n", "compile").stdout
    (checkout / "kernels" / source).write_text((checkout / "kernels" / source).read_text() + "\n")
    proc = snakemake(checkout, "-n", "compile")
    assert job_counts(proc.stdout) == {"compile_kernel": kernels * len(_archs_here()), "all_built": 1, "compile": 1}


@pytest.fixture(scope="module")
def measured(tmp_path_factory, built):
    """A checkout with every kernel built and the H200 archive in place, newer than the builds. Kernels
    the archive has no records of (added to config since that run) are left out of `versions` and
    `headline`; where none of the headline is archived, the archive's own headline stands; and the
    configurations it did not run in are left out of `configurations`. Made once for the tests below,
    which each change a copy (measured_checkout)."""
    import yaml

    checkout = with_build(copy_checkout(tmp_path_factory.mktemp("measured")), built)
    text = (checkout / "config.yaml").read_text()
    recorded = json.loads((ROOT / "results" / "nvidia-h200" / "kernels.json").read_text())
    archived = {k["name"] for k in recorded["kernels"]}
    for key in ("versions", "headline"):  # and the head-to-head's headline among them
        kept = [name for name in yaml.safe_load(text)[key] if name in archived] or recorded.get(key, [])
        text = re.sub(rf"^{key}: \[.*\]$", f"{key}: [{', '.join(kept)}]", text, count=1, flags=re.M)
    ran_in = [c["name"] for c in recorded.get("configurations", [])] or [next(iter(yaml.safe_load(text)["configurations"]))]
    for name in yaml.safe_load(text)["configurations"]:
        if name not in ran_in:
            text = re.sub(rf"^  {name}: \{{.*\}}\n", "", text, count=1, flags=re.M)
            text = re.sub(rf"^      {name}: \{{.*\}}\n", "", text, count=1, flags=re.M)  # its goal
            text = re.sub(rf"^    {name}: \{{.*\}}\n", "", text, count=1, flags=re.M)  # its head-to-head's settings
    text = re.sub(r"^(    configurations: )\[(.*)\]", lambda m: m[1] + "[" + ", ".join(
        name for name in m[2].split(", ") if name in ran_in) + "]", text, flags=re.M)  # and from what runs in them
    (checkout / "config.yaml").write_text(text)
    # the builds of these versions: all done (a shorter list remakes the all-built mark, here, without a GPU)
    assert snakemake(checkout, "build/all-built").returncode == 0
    assert "Nothing to be done" in snakemake(checkout, "-n", "build/all-built", *H200).stdout
    now = time.time()
    for age, pattern in enumerate(["results/nvidia-h200/*/*.json", "results/nvidia-h200/*.*", "reports/nvidia-h200/*"]):
        for path in ROOT.glob(pattern):  # in pipeline order: checks and timings, tables, report
            copy = checkout / path.relative_to(ROOT)
            copy.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(path, copy)
            os.utime(copy, (now + age, now + age))
    return checkout


@pytest.fixture
def measured_checkout(measured, tmp_path):
    """A copy of `measured`, file times kept, for a test to change."""
    return shutil.copytree(measured, tmp_path / "measured", symlinks=True)


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


GPU_TARGETS = ["check", "bench", "sweep", "profile", "head_to_head", "cycles", "ablation_br128", "ablation_hybrid_smem"]


@NO_GPU
@pytest.mark.parametrize("args", [[target] for target in GPU_TARGETS] + [["-n", "check"], ["-n", "ablation_br128"]])
def test_without_a_gpu_a_gpu_stage_fails_at_once(checkout, args):
    proc = snakemake(checkout, *args)
    assert proc.returncode != 0
    # the banner names every GPU stage, then the error is the last line, before any job
    banner, error = proc.stderr.splitlines()[1], proc.stderr.splitlines()[-1]
    assert banner.startswith("no NVIDIA GPU found: `snakemake report` compiles the kernels")
    stages = f"{', '.join(GPU_TARGETS[:-1])} and {GPU_TARGETS[-1]}"
    assert banner.endswith(f"{stages} need a GPU and stop at once without one")
    assert error.startswith("error: no NVIDIA GPU found")
    assert "Job stats" not in proc.stdout + proc.stderr
    assert not (checkout / "build").exists()  # nothing compiled first


def test_a_kernel_that_does_not_compile_shows_nvccs_error_on_the_console(checkout):
    source = checkout / "kernels" / "v11.cu"
    source.write_text(source.read_text() + "this is not CUDA\n")
    proc = snakemake(checkout, "build/sm_90/v11.json")
    assert proc.returncode != 0  # through the rule's tee: Snakemake's bash has pipefail
    console = proc.stdout + proc.stderr
    at = console.index("error: compiling v11 for sm_90 failed:")
    assert re.match(r"error: compiling v11 for sm_90 failed:\nkernels/v11\.cu\(\d+\): error: ", console[at:])
    log = (checkout / "logs" / "compile" / "sm_90" / "v11.log").read_text()
    assert "-ptx -arch=sm_90" in log.splitlines()[0]  # the command, then all nvcc said, then the error
    assert log.count("this is not CUDA") == 2 and log.rstrip().endswith('in the compilation of "kernels/v11.cu".')
    assert not (checkout / "build" / "sm_90" / "v11.json").exists()


def test_without_nvcc_a_compile_says_so_on_the_console(checkout):
    nvcc = os.path.dirname(shutil.which("nvcc"))
    path = os.pathsep.join(d for d in os.environ["PATH"].split(os.pathsep) if d != nvcc)
    if shutil.which("tee", path=path) is None:
        pytest.skip(f"nvcc shares {nvcc} with the shell's tools")
    proc = snakemake(checkout, "build/sm_90/v11.json", env={**os.environ, "PATH": path})
    assert proc.returncode != 0
    assert "error: nvcc not found on PATH: the compile stage needs the CUDA toolkit" in proc.stdout + proc.stderr


@NO_GPU
def test_gpu_cli_stage_without_a_gpu_is_one_clear_line(tmp_path, settings_file):
    cubin, record = tmp_path / "v11.cubin", tmp_path / "v11.json"  # a build and its record: never read
    cubin.write_bytes(b"")
    record.write_text("{}")
    proc = subprocess.run([sys.executable, "-m", "flashbench", "check", "--settings", settings_file, "--cubin",
                           str(cubin), "--record", str(record), "--out", str(tmp_path / "o.json")],
                          cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 1
    assert proc.stderr.strip().startswith("error: no NVIDIA GPU found")
    assert "Traceback" not in proc.stderr and not (tmp_path / "o.json").exists()


def test_without_a_sweep_in_config_the_rest_still_runs(checkout):
    import yaml

    config = yaml.safe_load((checkout / "config.yaml").read_text())
    del config["sweep"]
    (checkout / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    proc = snakemake(checkout, "-n", *H200)
    assert proc.returncode == 0, proc.stderr
    counts = job_counts(proc.stdout)
    assert "sweep_kernel" not in counts and "sweep_peer" not in counts and counts["summarize"] == 1


SLURM_PROFILE = ROOT / "workflow" / "profiles" / "slurm" / "config.yaml"
GPU_RULES = {"check_kernel", "check_peer", "bench_kernel", "bench_peer", "sweep_kernel", "sweep_peer", "profile_kernel",
             "head_to_head_point", "cycles_kernel", "cycles_peer"}


def job_resources(stdout: str) -> dict:
    """Each rule of a dry run's jobs, with the resources its jobs print (all its jobs alike)."""
    resources = {}
    for rule, body in re.findall(r"^(?:rule|checkpoint) (\w+):\n(.*?)(?=^\S|\Z)", stdout, re.M | re.S):
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


def archive_files(checkout) -> dict:
    return {str(p.relative_to(checkout)): p.read_bytes() for name in ("results", "reports")
            for p in sorted((checkout / name).rglob("*")) if p.is_file()}


def as_cloned(checkout):
    """The archive older than the code, as git leaves a fresh clone (results/ and reports/ are written
    before workflow/): on a GPU every stage is due."""
    long_ago = time.time() - 2 * 86400
    for path in [*(checkout / "results").rglob("*"), *(checkout / "reports").rglob("*")]:
        os.utime(path, (long_ago, long_ago))
    return checkout


@NO_GPU
def test_a_gpu_named_in_config_but_not_found_stops_before_any_job_and_the_archive_stays(checkout, tmp_path, settings):
    """README's SLURM command without the profile, on a machine without a GPU: refused before any job,
    so no record is deleted or overwritten, and on the GPU the same jobs are due as before it (every
    kernel's check, its build being gone)."""
    checkout = as_cloned(with_archive(checkout))
    archived = archive_files(checkout)
    a_gpu = a_gpu_here(tmp_path)
    due = job_counts(snakemake(checkout, "-n", env=a_gpu).stdout)
    proc = snakemake(checkout, "report", "--keep-going", *H200)
    assert proc.returncode != 0
    assert proc.stderr.strip().splitlines()[-1].startswith(
        "error: config names the GPU nvidia-h200 (sm_90), but no NVIDIA GPU is found here and jobs run here")
    assert "Finished job" not in proc.stderr and not (checkout / "build").exists()
    assert archive_files(checkout) == archived
    counts = job_counts(snakemake(checkout, "-n", env=a_gpu).stdout)
    assert counts == due and counts["check_kernel"] == len(settings.kernel_builds())


@NO_GPU
def test_a_gpu_job_that_fails_leaves_its_archived_record_as_it_was(built_checkout, tmp_path):
    checkout = with_archive(built_checkout)
    record = checkout / "results" / "nvidia-h200" / "check" / "v11.json"
    archived = record.read_bytes()
    proc = snakemake(checkout, "-c1", "-f", record.relative_to(checkout), env=a_gpu_here(tmp_path))  # CUDA fails
    assert proc.returncode != 0 and "error: CUDA failed in check" in proc.stdout + proc.stderr
    assert record.read_bytes() == archived


@NO_GPU
@pytest.mark.parametrize("table", ["summary.csv", "kernels.json"])
def test_a_damaged_archive_deletes_no_report(checkout, table):
    checkout = with_archive(checkout)
    damaged = checkout / "results" / "nvidia-h200" / table
    damaged.write_bytes(damaged.read_bytes()[: damaged.stat().st_size // 3])
    def report_files():
        return {path: data for path, data in archive_files(checkout).items() if path.startswith("reports/nvidia-h200/")}

    reports = report_files()
    assert len(reports) == 7
    proc = snakemake(checkout, "reports/nvidia-h200/report.md")
    assert proc.returncode != 0
    assert report_files() == reports


VANISHED = ("error: reports/nvidia-h200/ is archived, but the tables it is rendered from are gone ({}): restore "
            "them with `git checkout results/nvidia-h200` (or `git restore results/nvidia-h200`), or retire that GPU by "
            "removing both results/nvidia-h200/ and reports/nvidia-h200/")


@NO_GPU
@pytest.mark.parametrize("gone, lacks", [("summary.csv", "results/nvidia-h200/ lacks summary.csv"),
                                         ("kernels.json", "results/nvidia-h200/ lacks kernels.json"),
                                         ("the folder", "results/nvidia-h200/ is not there")])
def test_a_report_folder_whose_archive_is_gone_stops_every_run_and_changes_nothing(checkout, gone, lacks):
    """Passed over, the GPU would drop out of reports/README.md and compare.png while reports/<gpu>/
    stayed: instead every run stops before any job (a dry run too) with one line saying how to restore the
    tables or retire the GPU, and results/ and reports/ stay as they were."""
    checkout = with_archive(checkout)
    archive = checkout / "results" / "nvidia-h200"
    if gone == "the folder":
        archive.rename(archive.with_name("nvidia-h200.old"))
    else:
        (archive / gone).unlink()
    archived = archive_files(checkout)
    for args in (["-n"], ["report"], ["compile"]):
        proc = snakemake(checkout, *args)
        assert proc.returncode != 0
        errors = [line for line in proc.stderr.splitlines() if line.startswith("error")]
        assert errors == [VANISHED.format(lacks)] and proc.stderr.splitlines()[-1] == errors[0], proc.stderr
        assert "Job stats" not in proc.stdout + proc.stderr
    assert archive_files(checkout) == archived
    assert not (checkout / "build").exists() and not (checkout / "logs").exists()


def test_the_gpu_a_run_measures_may_have_a_report_folder_without_its_tables(checkout):
    """On its own GPU, a run makes the tables: summarize rewrites them from the records (the GPU's
    first run has neither tables nor reports, and one that stopped before summarize no reports)."""
    checkout = with_archive(checkout)
    (checkout / "results" / "nvidia-h200" / "summary.csv").unlink()
    proc = snakemake(checkout, "-n", *H200)
    assert proc.returncode == 0, proc.stderr
    assert job_counts(proc.stdout)["summarize"] == 1


@NO_GPU
def test_a_folder_under_results_that_is_no_archive_is_skipped_saying_so(checkout):
    checkout = with_archive(checkout)
    shutil.copytree(checkout / "results" / "nvidia-h200", checkout / "results" / "nvidia-h200.bak")
    proc = snakemake(checkout, "-n")
    assert proc.returncode == 0, proc.stderr
    assert ("results/nvidia-h200.bak: not a GPU archive (not a GPU's folder name, such as nvidia-h200), skipped"
            in proc.stderr.splitlines())
    assert job_counts(proc.stdout)["render_report"] == len(ARCHIVED)


@NO_GPU
def test_a_peer_skipped_for_want_of_torch_is_checked_again_once_torch_is_installed(built_checkout, tmp_path):
    from flashbench.peers import installed_version

    if installed_version("torch") is not None:
        pytest.skip("torch is installed here")
    checkout, env = with_archive(built_checkout), a_gpu_here(tmp_path)
    record = "results/nvidia-h200/check/sdpa_auto.json"
    assert snakemake(checkout, "-c1", "-f", record, env=env).returncode == 0  # the GPU's there, torch is not
    assert json.loads((checkout / record).read_text())["skipped"] == "torch is not installed"
    assert "Nothing to be done" in snakemake(checkout, "-n", record, env=env).stdout
    site = tmp_path / "site" / "torch-9.9.dist-info"  # what pip leaves of a torch (its import is not needed)
    site.mkdir(parents=True)
    (site / "METADATA").write_text("Metadata-Version: 2.1\nName: torch\nVersion: 9.9\n")
    proc = snakemake(checkout, "-n", record, env={**env, "PYTHONPATH": str(site.parent)})
    assert job_counts(proc.stdout) == {"check_peer": 1}, proc.stderr


def inputs_sha256(checkout, paths) -> dict:
    """What a record names it was made from: each of `paths` (relative to `checkout`) with its sha256."""
    from flashbench.files import digests

    sums = digests(checkout / path for path in paths)
    return {path: sums[str(checkout / path)] for path in paths}


def test_a_record_made_from_the_same_bytes_is_up_to_date_whatever_the_file_times(checkout, built, tmp_path):
    """A fresh clone's files all take the clone's time, and its builds are new: a record that names its
    inputs with their sha256 (inputs_sha256) is up to date while those bytes are the same, and only
    then. A record that names none goes by file times."""
    from flashbench import codegraph
    from flashbench.files import write_json

    with_build(checkout, built)
    record = checkout / "results" / "nvidia-h200" / "check" / "br128.json"
    inputs = ["build/sm_90/br128.cubin", "build/sm_90/br128.json", *codegraph.command_files("check")]
    write_json(record, {"kernel": "br128", "inputs_sha256": inputs_sha256(checkout, inputs)})
    os.utime(record, (time.time() - 3600, time.time() - 3600))  # older than every input
    target = ("-n", "results/nvidia-h200/check/br128.json", *H200)

    proc = snakemake(checkout, *target)
    assert proc.returncode == 0 and "Nothing to be done" in proc.stdout, proc.stdout + proc.stderr

    check = checkout / "workflow" / "flashbench" / "check.py"  # the check's code changes
    check.write_text(check.read_text() + "\n# changed\n")
    proc = snakemake(checkout, *target)
    assert job_counts(proc.stdout) == {"check_kernel": 1}
    check.write_text(check.read_text().removesuffix("\n# changed\n"))
    assert "Nothing to be done" in snakemake(checkout, *target).stdout

    write_json(record, {"kernel": "br128"})  # made before records named their inputs: by file times
    os.utime(record, (time.time() - 3600, time.time() - 3600))
    assert job_counts(snakemake(checkout, *target).stdout) == {"check_kernel": 1}


def test_a_check_that_reruns_takes_the_timings_that_read_it_with_it_in_the_same_run(checkout, built):
    """A check record a GPU stage reads is ancient to it only while the check itself is made from what it
    reads now: a check that reruns for a change of its code reruns its timing in the same run, where
    Snakemake would pass over a job whose ancient input another job writes (and it would wait for the
    next run, whatever else of its own had changed)."""
    from flashbench import codegraph
    from flashbench.files import write_json

    with_build(checkout, built)
    results = checkout / "results" / "nvidia-h200"
    check, bench = results / "check" / "br128.json", results / "bench" / "br128.json"
    build = ["build/sm_90/br128.cubin", "build/sm_90/br128.json"]

    write_json(check, {"kernel": "br128",
                       "inputs_sha256": inputs_sha256(checkout, [*build, *codegraph.command_files("check")])})
    write_json(bench, {"kernel": "br128", "inputs_sha256": inputs_sha256(
        checkout, [*build, "results/nvidia-h200/check/br128.json", *codegraph.command_files("bench")])})
    for age, record in ((7200, check), (3600, bench)):  # both older than every input, the timing after its check
        os.utime(record, (time.time() - age, time.time() - age))
    target = ("-n", "results/nvidia-h200/bench/br128.json", *H200)
    assert "Nothing to be done" in snakemake(checkout, *target).stdout

    code = checkout / "workflow" / "flashbench" / "check.py"  # the check's code changes (the timing's does not)
    assert str(code.relative_to(checkout)) not in codegraph.command_files("bench")
    code.write_text(code.read_text() + "\n# changed\n")
    assert job_counts(snakemake(checkout, *target).stdout) == {"check_kernel": 1, "bench_kernel": 1}


def test_the_check_runs_every_kernel_build_and_peer_in_each_configuration_it_runs_in(checkout, settings):
    """`snakemake check` checks each kernel in each configuration it names (v25 and v25.causal, from
    builds of their own) and each peer in every configuration; the report's jobs are those of every
    configuration too."""
    proc = snakemake(checkout, "-n", "check", *H200)
    assert proc.returncode == 0, proc.stderr
    counts = job_counts(proc.stdout)
    assert counts["check_kernel"] == len(settings.kernel_builds())
    assert counts["check_peer"] == len(settings.peer_runs())
    assert "results/nvidia-h200/check/v25.causal.json" in proc.stdout
    assert "results/nvidia-h200/check/sdpa_cudnn.causal.json" in proc.stdout
    report = snakemake(checkout, "-n", *H200).stdout
    assert job_counts(report)["check_kernel"] == len(settings.kernel_builds())
    assert job_counts(report)["check_peer"] == len(settings.peer_runs())
    # the tables hold every configuration: summarize reads every build, run and point
    (summarize_inputs,) = re.findall(r"^rule summarize:\n\s+input: (.*)$", report, re.M)
    for path in ("build/sm_90a/v25.json", "build/sm_90a/v25.causal.json", "bench/v25.causal.json",
                 "sweep/sdpa_cudnn.causal.json", "check/flash_attn_cute.causal.json", "head_to_head/S4096.causal.json"):
        assert path in summarize_inputs
