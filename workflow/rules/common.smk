# Configuration, GPU detection and path helpers shared by every stage.
import functools
import re
import shlex
import shutil
import sys
from pathlib import Path

try:
    import flashbench
    from flashbench import archives as fb_archives
    from flashbench import codegraph as fb_codegraph
    from flashbench import compile as fb_compile
    from flashbench import config as fb_config
    from flashbench import files as fb_files
    from flashbench import gpu as fb_gpu
    from flashbench import peers as fb_peers
except ImportError:
    raise ImportError(
        "the flashbench package is not installed: run  python3 -m pip install -e .  in the repository root"
    ) from None

# The JSON schema and the checks a schema cannot express, before any job starts. Every command reads
# the validated config (config.yaml with the --config overlays) from one file, SETTINGS_FILE; a rule's
# params carry a digest of what its command reads of it (settings_of), so a change reruns those jobs.
for configfile_read in workflow.configfiles:  # Snakemake's own reading lets a key given twice pass, the last winning
    fb_config.read(configfile_read)
SETTINGS = fb_config.validate(config)
SETTINGS_FILE = fb_config.write_settings(config, ".snakemake/flashbench/settings")  # run state, never archived
KERNELS = {k.name: k for k in SETTINGS.kernels}
# Each kernel in each configuration it runs in (config.Run), by its build's name: the kernel's in the
# first configuration (v25), <kernel>.<configuration> in another (v25.causal)
BUILDS = {run.name: run for run in SETTINGS.kernel_builds()}
PEER_RUNS = {run.name: run for run in SETTINGS.peer_runs()}  # each peer in each configuration, the same way
PEERS = {p.name: p for p in SETTINGS.peers}
# Every run, checked, timed, swept and counted, in table order: each configuration's kernels, then its peers
RUNS = [run.name for run in SETTINGS.runs()]
PY = shlex.quote(sys.executable)

# GPU mode when a GPU is found (or named in config); otherwise the archive-only mode.
DETECTED = fb_gpu.detect()
GPU_SLUG = SETTINGS.gpu or (DETECTED.slug if DETECTED else None)
GPU_ARCH = SETTINGS.gpu_arch or (DETECTED.arch if DETECTED else None)
if GPU_SLUG and not GPU_ARCH:
    raise fb_config.ConfigError(
        f"config key 'gpu_arch': no GPU found to read it from; set it for gpu={GPU_SLUG!r} or leave 'gpu' null"
    )
if GPU_ARCH and GPU_ARCH not in fb_config.supported_archs():
    raise fb_config.ConfigError(
        f"the GPU here ({DETECTED.name if DETECTED else GPU_SLUG}, {GPU_ARCH}) is not one the kernels are built for "
        f"({', '.join(fb_config.supported_archs())}: stmatrix and the write-up's kernels need sm_90 or newer)"
    )
if SETTINGS.gpu and DETECTED and SETTINGS.gpu != DETECTED.slug:
    raise fb_config.ConfigError(
        f"config key 'gpu': {SETTINGS.gpu!r}, but the GPU here is {DETECTED.name} ({DETECTED.slug}): its timings "
        f"would be archived under another GPU's name; leave 'gpu' null or run on that GPU"
    )
if SETTINGS.gpu_arch and DETECTED and SETTINGS.gpu_arch != DETECTED.arch:
    raise fb_config.ConfigError(
        f"config key 'gpu_arch': {SETTINGS.gpu_arch!r}, but the GPU here ({DETECTED.name}) is {DETECTED.arch}"
    )
GPU_MODE = GPU_SLUG is not None


# A GPU named in config but not found here is for a cluster to run on: the local executor would start
# every GPU job only to see it fail. Refused before any job (onstart runs after the DAG is built,
# never for a dry run); a job of a cluster executor (not the main process) does not ask.
onstart:
    if GPU_MODE and DETECTED is None and workflow.is_main_process and workflow.local_exec and not workflow.touch:
        print(
            f"error: config names the GPU {GPU_SLUG} ({GPU_ARCH}), but no NVIDIA GPU is found here and jobs run "
            f"here (the local executor): run where that GPU is, submit through a cluster profile "
            f"(--workflow-profile workflow/profiles/slurm), or leave 'gpu' null to compile and re-render the archive",
            file=sys.stderr,
        )
        raise SystemExit(1)


ARCHS = SETTINGS.archs + ([GPU_ARCH] if GPU_MODE and GPU_ARCH not in SETTINGS.archs else [])
# The profile stage runs where Nsight Compute is found (config `ncu`), and only with a GPU.
NCU = None if SETTINGS.ncu is False else shutil.which(SETTINGS.ncu or "ncu")
PROFILE = GPU_MODE and NCU is not None
PROFILE_NOTE, CYCLES_NOTE = SETTINGS.profiling_notes(ncu_found=NCU is not None)
PACKAGE = Path("workflow/flashbench")
KERNEL_HEADERS = sorted(str(p) for p in Path("kernels").glob("*.cuh"))
REPORT_TEMPLATE = "workflow/templates/report.md.j2"
HOPPER_TEMPLATE = "workflow/templates/hopper.md.j2"  # rendered beside it, from the same folder
COMPARE_TEMPLATE = "workflow/templates/compare.md.j2"
# The HTML pages of Snakemake's report (snakemake --report): each markdown report and table as a page
PAGES = "build/pages"
# every GPU side by side, and its page
COMPARISON = {"table": "reports/README.md", "figure": "reports/compare.png", "page": f"{PAGES}/README.html"}
REPORTS = ("report", "hopper")  # reports/<gpu>/<name>.md
# results/<gpu>/<name>.csv of every archive: summary, resources, profile
REPORT_TABLES = tuple(Path(name).stem for name in fb_archives.TABLES if name.endswith(".csv"))
# and those of a run that had the head-to-head and cycles stages (see paired_tables)
PAIRED_TABLES = fb_archives.OPTIONAL_TABLES


wildcard_constraints:
    arch="sm_[0-9]+a?",
    kernel="|".join(KERNELS),
    build="|".join(map(re.escape, BUILDS)),
    peer="|".join(map(re.escape, PEER_RUNS)) or "(?!)",
    gpu="[a-z0-9][a-z0-9-]*",


def kernel_build(w):
    """The kernel build a job runs: its own (a check's, v25.causal) or its kernel's in the first
    configuration; None for a peer's or a point's job."""
    return w.get("build") or w.get("kernel")


def job_name(w):
    """What a job is for, as its record is named: its kernel build, its peer (run) or its point."""
    return kernel_build(w) or w.get("peer") or w.get("point")


def settings_of(stage):
    """A rule's params entry: the digest of what `stage`'s command reads of the settings for the job's
    kernel or peer (config.Settings.used_by)."""
    return lambda w: fb_config.digest(SETTINGS.used_by(stage, job_name(w)))


def command_code(command):
    """The package's files `python -m flashbench <command>` runs, from the import graph (codegraph): a
    rule's code inputs, so that editing a module reruns exactly the jobs whose command uses it."""
    return fb_codegraph.command_files(command, str(PACKAGE))


def kernel_archs(name):
    """What a kernel's build (a kernel, or one in another configuration) is built for: the kernel's own
    `archs` in config, else every arch in ARCHS."""
    return KERNELS[BUILDS[name].of].archs or ARCHS


def build_of(name, ext):
    """build/<arch>/<kernel>.<ext> of the kernel's build that runs on this GPU (sm_90a's on an sm_90).
    A kernel with no such build gets its first one, whose record the check stage turns into a skip
    with the reason (and every later stage follows the check)."""
    from flashbench.compile import runnable_build

    archs = kernel_archs(name)
    return f"build/{runnable_build(archs, GPU_ARCH) or archs[0]}/{name}.{ext}"


def after_the_builds(names):
    """Wait for the builds of kernels `names` that run here (compile is a checkpoint): until they are
    done this raises, and Snakemake decides the job again once they are, by their content
    (by_content): a fresh clone's rebuilt cubins are new files, but the bytes its records were made
    from. No build runs beside a timing all the same: a compile holds every GPU's lock, shared."""
    for name in names:
        checkpoints.compile_kernel.get(arch=Path(build_of(name, "cubin")).parent.name, build=name)


@functools.cache
def _sha256(path, mtime_ns, size):
    return fb_files.sha256(path)


def _unchanged(path, sha):
    stat = Path(path).stat() if Path(path).is_file() else None
    return stat is not None and sha == _sha256(path, stat.st_mtime_ns, stat.st_size)


def by_content(record, inputs):
    """`inputs` (a name -> a path or a list of paths) of the job that writes `record`, each path ancient
    (its file time not compared) where `record` names it with its sha256 as it is now (inputs_sha256):
    on a fresh clone, whose files all take the clone's time, only what differs by content reruns. A
    record that names none (made before records named them) goes by file times.
    An input that is itself a record of this run (a check's, under results/<gpu>/) is ancient only where
    that record is made from its own inputs as they are now, so that its job does not rerun for a
    change of content: Snakemake passes over a job whose ancient input another job of the run writes,
    whatever else of the job's has changed, so a GPU stage whose check reran (its code changed, say)
    would wait for the next run."""
    made_from = fb_files.made_from(record)

    def current(path):  # a record of this run: made from what its job reads now
        own = fb_files.made_from(path) if path.startswith(f"results/{GPU_SLUG}/") else None
        return own is None or (bool(own) and all(_unchanged(p, sha) for p, sha in own.items()))

    def mark(path):
        same = path in made_from and _unchanged(path, made_from[path]) and current(path)
        return ancient(path) if same else path

    return {key: [mark(p) for p in value] if isinstance(value, list) else mark(value) for key, value in inputs.items()}


def measured(stage, inputs_of, built=lambda w: [kernel_build(w)] if kernel_build(w) else []):
    """The input function of a GPU stage's rule: `inputs_of(wildcards)` once the builds it runs are done
    (`built(wildcards)`: the job's kernel build, if any), by content against the job's record
    (results/<gpu>/<stage>/<build, kernel, peer or point>.json)."""

    def inputs(w):
        after_the_builds(built(w))
        return by_content(f"results/{GPU_SLUG}/{stage}/{job_name(w)}.json", inputs_of(w))

    return inputs


def kernel_files(w, check=True):
    """A kernel's GPU job's files: its build for this GPU (the job's build, or its kernel's in the first
    configuration) and, after the check, its check record (the command line names them from params:
    before the builds are done its inputs are not known)."""
    name = kernel_build(w)
    return {"cubin": build_of(name, "cubin"), "record": build_of(name, "json"),
            **({"check": f"results/{GPU_SLUG}/check/{name}.json"} if check else {})}


def peer_files(w, check=True):
    """A peer's GPU job's files: after the check, its check record."""
    return {"check": f"results/{GPU_SLUG}/check/{w.peer}.json"} if check else {}


def kernel_inputs(stage, check=True):
    """A kernel's GPU job's inputs: kernel_files and the code of its command (the stage's name)."""
    return measured(stage, lambda w: {**kernel_files(w, check), "code": command_code(stage)})


def peer_inputs(stage, check=True):
    """A peer's GPU job's inputs: peer_files and the code of its command (the stage's name)."""
    return measured(stage, lambda w: {**peer_files(w, check), "code": command_code(stage)})


def compile_records(builds=BUILDS):
    """The compile records of `builds` (every kernel build, unless given) for each arch each is built for."""
    return [f"build/{arch}/{name}.json" for name in builds for arch in kernel_archs(name)]


ABLATIONS = [name for name, k in KERNELS.items() if k.kind == "ablation"]
GPU_TARGETS = ["check", "bench", "sweep", "profile", "head_to_head", "cycles",
               *(f"ablation_{name}" for name in ABLATIONS)]
# The head-to-head's points (shape, configuration), by the wildcard that names each: S1024, S1024.causal
HEAD_TO_HEAD_POINTS = SETTINGS.head_to_head_points()
# Cycle counts: every kernel and peer at the case, the contestants at every point too (ncu found: see NCU)
CYCLES = PROFILE and SETTINGS.cycles is not None


def fail_without_gpu(wildcards):
    """Input of a GPU stage's target where no GPU is found: Snakemake stops with one line as it
    builds the DAG, so a dry run fails too and nothing is compiled first."""
    try:
        fb_gpu.require()
    except fb_gpu.NoGPUError as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(1)
    return []


def ablation_outputs(name):
    """What `snakemake ablation_<name>` brings up to date: that kernel's builds, check, timing, sweep
    and profile (the first configuration's: an ablation runs there alone), then the report. Other kernels' jobs run only where the report needs them redone
    (their source changed too)."""
    return (
        expand("build/{arch}/{kernel}.{ext}", arch=kernel_archs(name), kernel=name, ext=("cubin", "json"))
        + [f"results/{GPU_SLUG}/check/{name}.json", f"results/{GPU_SLUG}/bench/{name}.json"]
        + report_outputs(GPU_SLUG)
    )


def run_records(stage, names=RUNS):
    return expand(f"results/{GPU_SLUG}/{stage}/{{name}}.json", name=names)


# A GPU's report folder whose tables are gone from results/ (deleted, the folder renamed) stops every run,
# a dry run too, before any job: passed over, that GPU would drop out of reports/README.md while its
# reports stayed. The GPU this run measures is not asked: its run makes its tables.
VANISHED = fb_archives.vanished("results", "reports", running=GPU_SLUG)
if VANISHED:
    print(f"error: {fb_archives.vanished_message(VANISHED)}", file=sys.stderr)
    raise SystemExit(1)

# The GPUs archived under results/; any other folder there is passed over, with one line saying so
ARCHIVED, NOT_ARCHIVES = fb_archives.find("results", running=GPU_SLUG)
for line in NOT_ARCHIVES:
    print(line, file=sys.stderr)


def archive_output(path):
    """An archived file as a job's output (results/<gpu>/..., reports/...): Snakemake neither removes
    it before the job runs nor after the job fails (it restores its copy), so a failed or interrupted
    job leaves the archive as it was; the job itself replaces the file whole (files.staged)."""
    return update(path)


# A peer's check reruns when a package it needs comes or goes (or changes version): a peer skipped
# for want of torch or FlashAttention is not up to date once it is installed.
LIBRARIES = {name: fb_peers.libraries(PEERS[run.of]) for name, run in PEER_RUNS.items()}


def report_figures(gpu):
    names = ("tflops.png", "sweep.png", "stalls.png", "hopper_tflops.png", "hopper_sweep.png")
    return [f"reports/{gpu}/{name}" for name in names]


def paired_tables(gpu):
    """Which of PAIRED_TABLES `gpu`'s report is rendered from: for the GPU this run measures, those its
    config asks for; for an archived GPU, those its archive holds."""
    if GPU_MODE and gpu == GPU_SLUG:
        return [t for t, asked in zip(PAIRED_TABLES, (SETTINGS.head_to_head, SETTINGS.cycles)) if asked]
    return [t for t in PAIRED_TABLES if Path(f"results/{gpu}/{t}.csv").exists()]


def paired_table_files(w):
    """results/<gpu>/<table>.csv of each of paired_tables(w.gpu)."""
    return [f"results/{w.gpu}/{table}.csv" for table in paired_tables(w.gpu)]


def absent_tables(w):
    """`--absent` and the PAIRED_TABLES `w.gpu`'s report has not (their pages say so), or nothing."""
    missing = [t for t in PAIRED_TABLES if t not in paired_tables(w.gpu)]
    return shlex.join(["--absent", *missing]) if missing else ""


def report_pages(gpu, names):
    """The HTML page of each of `names` (reports or tables) of `gpu`, by name."""
    return {name: f"{PAGES}/{gpu}/{name}.html" for name in names}


def report_outputs(gpu):
    return [*(f"reports/{gpu}/{name}.md" for name in REPORTS), *report_figures(gpu)]


def in_report(path, subcategory, caption=None):
    """`path` as an item of Snakemake's HTML report (snakemake --report report.html): under its GPU
    (a path with {gpu}) or under "all GPUs", captioned by workflow/report/<caption or file stem>.rst."""
    return report(
        path,
        caption=f"../report/{caption or Path(path).stem}.rst",
        category="{gpu}" if "{gpu}" in path else "all GPUs",
        subcategory=subcategory,
    )


def reported_gpus():
    """The GPUs whose reports `report` brings up to date: every archived one, and this one's."""
    return sorted(set(ARCHIVED) | ({GPU_SLUG} if GPU_MODE else set()))


def rendered_reports():
    return [path for gpu in reported_gpus() for path in report_outputs(gpu)]


def html_report_pages():
    """The pages Snakemake's HTML report shows beside the figures, of each GPU (the comparison's is
    in COMPARISON)."""
    names = REPORTS + REPORT_TABLES + PAIRED_TABLES
    return [page for gpu in reported_gpus() for page in report_pages(gpu, names).values()]


if not GPU_MODE:
    print(
        f"no NVIDIA GPU found: `snakemake report` compiles the kernels and brings the reports of "
        f"{len(ARCHIVED)} archived GPU folder{'' if len(ARCHIVED) == 1 else 's'} ({', '.join(ARCHIVED) or 'none'}) "
        f"up to date; {', '.join(GPU_TARGETS[:-1])} and {GPU_TARGETS[-1]} need a GPU and stop at once without one",
        file=sys.stderr,
    )
