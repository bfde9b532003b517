# summarize: this GPU's records into its tidy tables (GPU mode only: an archive is never
# re-summarized with another machine's builds). render_report: any GPU's report from its tables.

if GPU_MODE:

    rule summarize:
        input:
            checks=expand(f"results/{GPU_SLUG}/check/{{kernel}}.json", kernel=KERNELS),
            benches=expand(f"results/{GPU_SLUG}/bench/{{kernel}}.json", kernel=KERNELS),
            compiled=compile_records(),
            code=package_modules("summary", "cli"),
        output:
            summary=f"results/{GPU_SLUG}/summary.csv",
            resources=f"results/{GPU_SLUG}/resources.csv",
            kernels=f"results/{GPU_SLUG}/kernels.json",
        log:
            f"logs/{GPU_SLUG}/summarize.log",
        params:
            kernels=json.dumps(
                [
                    {"name": k.name, **{f: getattr(k, f) for f in ("kind", "source", "defines", "change", "published_tflops", "published_registers", "parent")}}
                    for k in SETTINGS.kernels
                ]
            ),
            case=json.dumps(SETTINGS.case.as_dict()),
            gpu_arch=GPU_ARCH,
        shell:
            "{PY} -m flashbench summarize --kernels {params.kernels:q} --checks {input.checks}"
            " --benches {input.benches} --compiled {input.compiled} --gpu-arch {params.gpu_arch}"
            f" --case {{params.case:q}} --out-dir results/{GPU_SLUG} > {{log}} 2>&1"


rule render_report:
    input:
        summary="results/{gpu}/summary.csv",
        resources="results/{gpu}/resources.csv",
        kernels="results/{gpu}/kernels.json",
        template=REPORT_TEMPLATE,
        code=package_modules("report", "conclusions", "claims", "occupancy", "cli"),
    output:
        report="reports/{gpu}/report.md",
        figure="reports/{gpu}/tflops.png",
    log:
        "logs/{gpu}/render_report.log",
    shell:
        "{PY} -m flashbench render --results results/{wildcards.gpu} --reports reports/{wildcards.gpu}"
        " --template {input.template} --slug {wildcards.gpu} > {log} 2>&1"
