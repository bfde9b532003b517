# Chapter G3 of "Flash Attention CUDA Kernel optimisation: from 56 to 986 TFLOPS on B300",
# regenerated on the GPU at hand:  snakemake  (the same as  snakemake report).
#
# Named targets: report (default), compile, check, bench.
# With a GPU: compile -> check -> bench -> summarize -> render_report, archived under
# results/<gpu>/ and reports/<gpu>/. Without one: compile, then re-render every archived report.
from snakemake.utils import min_version

min_version("9.27.1")


configfile: "config.yaml"


include: "workflow/rules/common.smk"


if GPU_MODE:

    rule report:
        input:
            report_outputs(GPU_SLUG),

else:

    rule report:
        input:
            compile_records(),
            archived_results(),
            template=REPORT_TEMPLATE,
            code=package_modules("report", "conclusions", "cli"),
        log:
            "logs/rerender-archive.log",
        shell:
            "{PY} -m flashbench rerender-archive --template {input.template} 2>&1 | tee {log}"


rule compile:
    input:
        compile_records(),


include: "workflow/rules/compile.smk"
include: "workflow/rules/check.smk"
include: "workflow/rules/bench.smk"
include: "workflow/rules/report.smk"
