# Chapter G3 of "Flash Attention CUDA Kernel optimisation: from 56 to 986 TFLOPS on B300",
# regenerated on the GPU at hand:  snakemake  (the same as  snakemake report).
#
# Named targets: report (default), compile, check, bench, sweep, profile, head_to_head, cycles, and
# ablation_<name> for each ablation in config.yaml (ablation_br128, ablation_hybrid_smem): that
# ablation is compiled, checked, timed, swept and profiled where out of date (-R
# results/<gpu>/bench/<name>.json times it again regardless), and the report refreshed; other
# kernels' jobs run only where they are out of date too.
# With a GPU: compile -> check -> bench, sweep, head_to_head, profile and cycles (where ncu is
# found) -> summarize -> render_report, kernels and peers alike, archived under results/<gpu>/ and
# reports/<gpu>/. With a GPU or without: compile, render_report for every GPU archived under
# results/, and compare_gpus (reports/README.md, reports/compare.png), each where out of date.
from snakemake.utils import min_version

min_version("9.27.1")


configfile: "config.yaml"


# snakemake --report report.html: every report, figure and table of every GPU, and the comparison
report: "workflow/report/workflow.rst"


include: "workflow/rules/common.smk"


rule report:
    input:
        compile_records(),
        rendered_reports(),
        COMPARISON.values(),
        html_report_pages(),


rule compile:
    input:
        compile_records(),
        "build/all-built",


if GPU_MODE:
    for ablation in ABLATIONS:

        rule:
            name:
                f"ablation_{ablation}"
            input:
                ablation_outputs(ablation),

else:
    for target in GPU_TARGETS:

        rule:
            name:
                target
            input:
                fail_without_gpu,


include: "workflow/rules/compile.smk"
include: "workflow/rules/check.smk"
include: "workflow/rules/bench.smk"
include: "workflow/rules/sweep.smk"
include: "workflow/rules/profile.smk"
include: "workflow/rules/head_to_head.smk"
include: "workflow/rules/cycles.smk"
include: "workflow/rules/report.smk"
