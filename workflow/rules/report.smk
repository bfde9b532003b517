# summarize: this GPU's records into its tidy tables (GPU mode only: an archive is never
# re-summarized with another machine's builds). render_report: any GPU's report from its tables.
# compare_gpus: every reported GPU's TFLOPS side by side. report_pages, comparison_page: what
# Snakemake's HTML report shows (snakemake --report): each markdown report and table as an HTML page,
# the figures inside the reports (the viewer shows images, HTML and PDF in the page, and offers
# anything else as a download).

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
            **{table: archive_output(f"results/{GPU_SLUG}/{table}.csv") for table in paired_tables(GPU_SLUG)},
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
                    "cycles_note": CYCLES_NOTE,
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


rule render_report:
    input:
        **{table: f"results/{{gpu}}/{table}.csv" for table in REPORT_TABLES},
        paired=paired_table_files,
        kernels="results/{gpu}/kernels.json",
        template=REPORT_TEMPLATE,
        hopper_template=HOPPER_TEMPLATE,
        code=package_modules("gpu_reports", "findings", "claims", "occupancy", "profile", "hopper_report", "cli"),
    output:
        **{name: archive_output(f"reports/{{gpu}}/{name}.md") for name in REPORTS},
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
        code=package_modules("gpu_comparison", "cli"),
    output:
        table=archive_output(COMPARISON["table"]),
        figure=archive_output(in_report(COMPARISON["figure"], "figures", "comparison_figure")),
    log:
        "logs/compare_gpus.log",
    params:
        results=expand("results/{gpu}", gpu=reported_gpus()),
    shell:
        "{PY} -m flashbench compare --results {params.results:q} --template {input.template}"
        " --table {output.table} --figure {output.figure} 2>&1 > {log} | tee -a {log} >&2"


rule report_pages:
    input:
        reports=expand("reports/{{gpu}}/{name}.md", name=REPORTS),
        figures=report_figures("{gpu}"),
        tables=expand("results/{{gpu}}/{table}.csv", table=REPORT_TABLES),
        paired=paired_table_files,
        code=package_modules("pages", "cli"),
    output:
        **{name: in_report(page, "report", name) for name, page in report_pages("{gpu}", REPORTS).items()},
        **{
            name: in_report(page, "tables", name)
            for name, page in report_pages("{gpu}", REPORT_TABLES + PAIRED_TABLES).items()
        },
    log:
        "logs/{gpu}/report_pages.log",
    params:
        out_dir=lambda w, output: Path(output.report).parent,
        absent=absent_tables,
    shell:
        "{PY} -m flashbench pages --sources {input.reports} {input.tables} {input.paired} {params.absent}"
        " --out-dir {params.out_dir}"
        " 2>&1 > {log} | tee -a {log} >&2"


rule comparison_page:
    input:
        table=COMPARISON["table"],
        figure=COMPARISON["figure"],
        code=package_modules("pages", "cli"),
    output:
        in_report(COMPARISON["page"], "report", "comparison_table"),
    log:
        "logs/comparison_page.log",
    params:
        out_dir=Path(COMPARISON["page"]).parent,
    shell:
        "{PY} -m flashbench pages --sources {input.table} --out-dir {params.out_dir} 2>&1 > {log} | tee -a {log} >&2"
