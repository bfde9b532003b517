# Chapter G3 of "Flash Attention CUDA Kernel optimisation: from 56 to 986 TFLOPS on B300",
# regenerated on the GPU at hand:  snakemake  (the same as  snakemake report).
#
# Named targets: report (default), compile, check, bench, sweep, profile, and ablation_<name> for each ablation in
# config.yaml (ablation_br128, ablation_hybrid_smem): that ablation is compiled, checked, timed, swept
# and profiled where out of date (-R results/<gpu>/bench/<name>.json times it again regardless), and
# the report refreshed; other kernels' jobs run only where they are out of date too.
# With a GPU: compile -> check -> bench, sweep, profile (where ncu is found) -> summarize ->
# render_report, kernels and PyTorch peers alike, archived under results/<gpu>/ and
# reports/<gpu>/. Without one: compile, then re-render every archived report.
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
            hopper_template=HOPPER_TEMPLATE,
            code=package_modules("report", "conclusions", "claims", "occupancy", "profile", "cli"),
        log:
            "logs/rerender-archive.log",
        shell:
            "{PY} -m flashbench rerender-archive --template {input.template} 2>&1 | tee {log}"


rule compile:
    input:
        compile_records(),
        "build/all-built",


for ablation in ABLATIONS:
    if GPU_MODE:

        rule:
            name:
                f"ablation_{ablation}"
            input:
                ablation_outputs(ablation),

    else:

        rule:
            name:
                f"ablation_{ablation}"
            log:
                f"logs/ablation_{ablation}-needs-gpu.log",
            shell:
                "{PY} -m flashbench require-gpu 2>&1 | tee {log}"


include: "workflow/rules/compile.smk"
include: "workflow/rules/check.smk"
include: "workflow/rules/bench.smk"
include: "workflow/rules/sweep.smk"
include: "workflow/rules/profile.smk"
include: "workflow/rules/report.smk"
