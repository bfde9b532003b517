# summarize: this GPU's records into its tidy tables (GPU mode only: an archive is never
# re-summarized with another machine's builds). render_report: any GPU's report from its tables.
# compare_gpus: every reported GPU's TFLOPS side by side. report_pages, comparison_page: what
# Snakemake's HTML report shows (snakemake --report): each markdown report and table as an HTML page,
# the figures inside the reports (the viewer shows images, HTML and PDF in the page, and offers
# anything else as a download).

if GPU_MODE:

    def summarized(w):
        """Every record of the run, by file time, and every build and the code, by content against
        kernels.json (see by_content). A record goes by its time: one a job rewrites (rerun, or asked
        for again with -R) makes the tables again, where Snakemake would pass over an input marked
        ancient however the job that writes it runs. On a fresh clone, whose checkout may leave a record
        newer than kernels.json, it may run once more: two seconds, and the same tables."""
        return {
            "checks": run_records("check"),
            "benches": run_records("bench"),
            "sweeps": run_records("sweep") if SETTINGS.sweep else [],
            "profiles": run_records("profile", KERNELS) if PROFILE else [],
            "head_to_heads": expand(f"results/{GPU_SLUG}/head_to_head/{{point}}.json", point=HEAD_TO_HEAD_POINTS),
            "cycles": run_records("cycles") if CYCLES else [],
            **by_content(f"results/{GPU_SLUG}/kernels.json",
                         {"compiled": compile_records(), "code": command_code("summarize")}),
        }

    rule summarize:
        input:
            unpack(summarized),
        output:
            summary=archive_output(f"results/{GPU_SLUG}/summary.csv"),
            resources=archive_output(f"results/{GPU_SLUG}/resources.csv"),
            profile=archive_output(f"results/{GPU_SLUG}/profile.csv"),
            **{table: archive_output(f"results/{GPU_SLUG}/{table}.csv") for table in paired_tables(GPU_SLUG)},
            kernels=archive_output(f"results/{GPU_SLUG}/kernels.json"),
        log:
            f"logs/{GPU_SLUG}/summarize.log",
        params:
            settings=settings_of("summarize"),
            gpu_arch=GPU_ARCH,
        shell:
            "{PY} -m flashbench summarize --settings {SETTINGS_FILE} --checks {input.checks}"
            " --benches {input.benches} --sweeps {input.sweeps} --profiles {input.profiles}"
            " --head-to-heads {input.head_to_heads} --cycles {input.cycles}"
            " --compiled {input.compiled} --gpu-arch {params.gpu_arch}"
            f" --out-dir results/{GPU_SLUG} --depends-on {{input}} 2>&1 > {{log}} | tee -a {{log}} >&2"


rule render_report:
    input:
        **{table: f"results/{{gpu}}/{table}.csv" for table in REPORT_TABLES},
        paired=paired_table_files,
        kernels="results/{gpu}/kernels.json",
        template=REPORT_TEMPLATE,
        hopper_template=HOPPER_TEMPLATE,
        code=command_code("render"),
    output:
        **{name: archive_output(f"reports/{{gpu}}/{name}.md") for name in REPORTS},
        **{Path(figure).stem: archive_output(in_report(figure, "figures")) for figure in report_figures("{gpu}")},
    log:
        "logs/{gpu}/render_report.log",
    params:
        settings=settings_of("render"),
    shell:
        "{PY} -m flashbench render --settings {SETTINGS_FILE} --results results/{wildcards.gpu}"
        " --reports reports/{wildcards.gpu} --template {input.template} --slug {wildcards.gpu} 2>&1 > {log} | tee -a {log} >&2"


rule compare_gpus:
    input:
        summaries=expand("results/{gpu}/summary.csv", gpu=reported_gpus()),
        kernels=expand("results/{gpu}/kernels.json", gpu=reported_gpus()),
        template=COMPARE_TEMPLATE,
        code=command_code("compare"),
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
        code=command_code("pages"),
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
        code=command_code("pages"),
    output:
        in_report(COMPARISON["page"], "report", "comparison_table"),
    log:
        "logs/comparison_page.log",
    params:
        out_dir=Path(COMPARISON["page"]).parent,
    shell:
        "{PY} -m flashbench pages --sources {input.table} --out-dir {params.out_dir} 2>&1 > {log} | tee -a {log} >&2"
