# summarize + render_report: one GPU's tidy tables, then its markdown report and figure.


rule summarize:
    input:
        checks=expand("results/{{gpu}}/check/{kernel}.json", kernel=KERNELS),
        benches=expand("results/{{gpu}}/bench/{kernel}.json", kernel=KERNELS),
        compiled=compile_records(),
        code=package_modules("summary", "cli"),
    output:
        summary="results/{gpu}/summary.csv",
        resources="results/{gpu}/resources.csv",
        kernels="results/{gpu}/kernels.json",
    log:
        "logs/{gpu}/summarize.log",
    params:
        kernels=json.dumps(
            [{"name": k.name, **{f: getattr(k, f) for f in ("kind", "source", "change", "published_tflops", "parent")}}
             for k in SETTINGS.kernels]
        ),
        case=json.dumps(SETTINGS.case.as_dict()),
        gpu_arch=GPU_ARCH,
    shell:
        "{PY} -m flashbench summarize --kernels {params.kernels:q} --checks {input.checks}"
        " --benches {input.benches} --compiled {input.compiled} --gpu-arch {params.gpu_arch}"
        " --case {params.case:q} --out-dir results/{wildcards.gpu} > {log} 2>&1"


rule render_report:
    input:
        summary="results/{gpu}/summary.csv",
        resources="results/{gpu}/resources.csv",
        kernels="results/{gpu}/kernels.json",
        template=REPORT_TEMPLATE,
        code=package_modules("report", "conclusions", "cli"),
    output:
        report="reports/{gpu}/report.md",
        figure="reports/{gpu}/tflops.png",
    log:
        "logs/{gpu}/render_report.log",
    shell:
        "{PY} -m flashbench render --results results/{wildcards.gpu} --reports reports/{wildcards.gpu}"
        " --template {input.template} --slug {wildcards.gpu} > {log} 2>&1"
