# compile: one cubin and one ptxas record per kernel and architecture (no GPU needed). The log
# gets all nvcc printed; a failure's first lines of error reach the console too (stderr through tee;
# both write by appending, so neither overwrites the other).


rule compile_kernel:
    input:
        source=lambda w: KERNELS[w.kernel].source,
        headers=KERNEL_HEADERS,
        code=package_modules("compile", "ptxas", "occupancy", "gpu", "gpulock", "cli"),
    output:
        cubin="build/{arch}/{kernel}.cubin",
        record="build/{arch}/{kernel}.json",
    log:
        "logs/compile/{arch}/{kernel}.log",
    params:
        flags=json.dumps(SETTINGS.nvcc_flags),
        defines=lambda w: json.dumps(KERNELS[w.kernel].defines),
    shell:
        ": > {log}; {PY} -m flashbench compile --kernel {wildcards.kernel} --source {input.source}"
        " --arch {wildcards.arch} --flags {params.flags:q} --defines {params.defines:q}"
        " --cubin {output.cubin} --record {output.record} 2>&1 >> {log} | tee -a {log} >&2"


# Every GPU job waits for every build, so no compile runs beside a timing (across runs the GPU
# lock keeps them apart too). ancient(): a rebuilt kernel reruns its own GPU jobs, not all of them.
rule all_built:
    input:
        compile_records(),
    output:
        touch("build/all-built"),
    log:
        "logs/compile/all-built.log",
    params:
        builds=len(compile_records()),
    shell:
        "echo 'all {params.builds} builds up to date' > {log}"
