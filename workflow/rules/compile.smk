# compile: one cubin and one ptxas record per kernel build (a kernel in one of its configurations) and
# architecture (no GPU needed). The log
# gets all nvcc printed; a failure's first lines of error reach the console too (stderr through tee;
# both write by appending, so neither overwrites the other).


# A checkpoint: the jobs that run what it builds ask for those builds first (after_the_builds), and
# Snakemake decides them again once the builds are done, by the builds' content (by_content).
checkpoint compile_kernel:
    input:
        source=lambda w: KERNELS[BUILDS[w.build].of].source,
        headers=KERNEL_HEADERS,
        code=command_code("compile"),
    output:
        cubin="build/{arch}/{build}.cubin",
        record="build/{arch}/{build}.json",
    log:
        "logs/compile/{arch}/{build}.log",
    params:
        settings=settings_of("compile"),
    shell:
        ": > {log}; {PY} -m flashbench compile --settings {SETTINGS_FILE} --kernel {wildcards.build}"
        " --arch {wildcards.arch} --cubin {output.cubin} --record {output.record} 2>&1 >> {log} | tee -a {log} >&2"


def own_archs_note():
    """One line per set of archs some kernels are built for alone, with why (compile.TARGET_NOTES)."""
    groups = {}
    for k in SETTINGS.kernels:
        if k.archs:
            groups.setdefault(tuple(k.archs), []).append(k.name)
    return "; ".join(
        f"{', '.join(names)} built for {', '.join(archs)} only"
        + "".join(f" ({fb_compile.TARGET_NOTES[a]})" for a in archs if a in fb_compile.TARGET_NOTES)
        for archs, names in groups.items()
    )


# `snakemake compile`'s last step: says every build is there, and why some kernels are built for one arch.
rule all_built:
    input:
        compile_records(),
    output:
        touch("build/all-built"),
    log:
        "logs/compile/all-built.log",
    params:
        builds=len(compile_records()),
        # why some kernels are not built for every arch (the Hopper line: sm_90a only)
        own_archs=own_archs_note(),
    shell:
        "(echo 'all {params.builds} builds up to date'; echo {params.own_archs:q}) | tee {log}"
