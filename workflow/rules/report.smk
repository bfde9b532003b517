# summarize: this GPU's records into its tidy tables (GPU mode only: an archive is never
# re-summarized with another machine's builds). render_report: any GPU's report from its tables.
# compare_gpus: every reported GPU's TFLOPS side by side.

if GPU_MODE:
    from flashbench.validation import Expected

    rule summarize:
        input:
            checks=run_records("check"),
            benches=run_records("bench"),
            sweeps=run_records("sweep") if SETTINGS.sweep else [],
            profiles=run_records("profile", KERNELS) if PROFILE else [],
            head_to_heads=expand(f"results/{GPU_SLUG}/head_to_head/{{point}}.json", point=HEAD_TO_HEAD_SHAPES),
            cycles=run_records("cycles") if CYCLES else [],
            compiled=compile_records(),
            code=package_modules("summary", "profile", "headtohead", "cycles", "cli"),
        output:
            summary=archive_output(f"results/{GPU_SLUG}/summary.csv"),
            resources=archive_output(f"results/{GPU_SLUG}/resources.csv"),
            profile=archive_output(f"results/{GPU_SLUG}/profile.csv"),
            head_to_head=archive_output(f"results/{GPU_SLUG}/head_to_head.csv"),
            cycles=archive_output(f"results/{GPU_SLUG}/cycles.csv"),
            kernels=archive_output(f"results/{GPU_SLUG}/kernels.json"),
        log:
            f"logs/{GPU_SLUG}/summarize.log",
        params:
            kernels=json.dumps(
                [
                    {"name": k.name, **{f: getattr(k, f) for f in ("kind", "source", "defines", "change", "published_tflops", "published_registers", "parent", "archs", "line")}}
                    for k in SETTINGS.kernels
                ]
                + [{**p.as_dict(), "kind": "peer"} for p in SETTINGS.peers]
            ),
            case=json.dumps(SETTINGS.case.as_dict()),
            settings=json.dumps(
                {
                    "baseline": SETTINGS.baseline,
                    "sweep": SETTINGS.sweep,
                    "profile_note": PROFILE_NOTE,
                    "headline": SETTINGS.headline,
                    "head_to_head": SETTINGS.head_to_head,
                    "cycles": SETTINGS.cycles,
                    "cycles_note": None if CYCLES else (PROFILE_NOTE or "not asked for (no cycles in config.yaml)"),
                }
            ),
            expected=Expected.from_settings(SETTINGS).as_json(),
            gpu_arch=GPU_ARCH,
        shell:
            "{PY} -m flashbench summarize --kernels {params.kernels:q} --checks {input.checks}"
            " --benches {input.benches} --sweeps {input.sweeps} --profiles {input.profiles}"
            " --head-to-heads {input.head_to_heads} --cycles {input.cycles}"
            " --compiled {input.compiled} --gpu-arch {params.gpu_arch} --case {params.case:q}"
            f" --settings {{params.settings:q}} --expected {{params.expected:q}} --out-dir results/{GPU_SLUG} 2>&1 > {{log}} | tee -a {{log}} >&2"


def paired_tables(w):
    """head_to_head.csv and cycles.csv, where this run makes them or the archive has them (one from
    before the head-to-head has neither, and its report says so)."""
    paths = [f"results/{w.gpu}/{table}.csv" for table in ("head_to_head", "cycles")]
    made_here = GPU_MODE and w.gpu == GPU_SLUG
    return [in_report(p, "tables") for p in paths if made_here or Path(p).exists()]


rule render_report:
    input:
        **{table: in_report(f"results/{{gpu}}/{table}.csv", "tables") for table in ("summary", "resources", "profile")},
        paired=paired_tables,
        kernels="results/{gpu}/kernels.json",
        template=REPORT_TEMPLATE,
        hopper_template=HOPPER_TEMPLATE,
        code=package_modules("report", "conclusions", "claims", "occupancy", "profile", "cli"),
    output:
        report=archive_output(in_report("reports/{gpu}/report.md", "report")),
        hopper=archive_output(in_report("reports/{gpu}/hopper.md", "report")),
        **{Path(figure).stem: archive_output(in_report(figure, "figures")) for figure in report_figures("{gpu}")},
    log:
        "logs/{gpu}/render_report.log",
    shell:
        "{PY} -m flashbench render --results results/{wildcards.gpu} --reports reports/{wildcards.gpu}"
        " --template {input.template} --slug {wildcards.gpu} 2>&1 > {log} | tee -a {log} >&2"


rule compare_gpus:
    input:
        summaries=expand("results/{gpu}/summary.csv", gpu=reported_gpus()),
        kernels=expand("results/{gpu}/kernels.json", gpu=reported_gpus()),
        template=COMPARE_TEMPLATE,
        code=package_modules("compare", "cli"),
    output:
        table=archive_output(in_report(COMPARISON["table"], "report", "comparison_table")),
        figure=archive_output(in_report(COMPARISON["figure"], "figures", "comparison_figure")),
    log:
        "logs/compare_gpus.log",
    params:
        results=expand("results/{gpu}", gpu=reported_gpus()),
    shell:
        "{PY} -m flashbench compare --results {params.results:q} --template {input.template}"
        " --table {output.table} --figure {output.figure} 2>&1 > {log} | tee -a {log} >&2"
