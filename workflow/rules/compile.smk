# compile: one cubin and one ptxas record per kernel and architecture (no GPU needed). The log
# gets all nvcc printed; a failure's first lines of error reach the console too (stderr through tee;
# both write by appending, so neither overwrites the other).


rule compile_kernel:
    input:
        source=lambda w: KERNELS[w.kernel].source,
        headers=KERNEL_HEADERS,
        code=package_modules("compile", "ptxas", "occupancy", "cli"),
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
