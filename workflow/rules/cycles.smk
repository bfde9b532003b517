# cycles: Nsight Compute's cycle counts, every kernel and peer at the case and the head-to-head's
# contestants at each of its points too (GPU, and ncu found: see NCU in common.smk).

if CYCLES:
    CYCLES_SETTINGS = dict(
        ncu=NCU,
        shapes=lambda w: json.dumps([s.as_dict() for s in cycle_shapes(w[0])]),  # w[0]: the kernel or peer
        launches=SETTINGS.cycles["launches"],
    )
    CYCLES_ARGS = (
        "--ncu {params.ncu:q} --check {input.check} --shapes {params.shapes:q} --launches {params.launches}"
        " --out {output} 2>&1 | tee {log}"
    )

    rule cycles_kernel:
        input:
            cubin=gpu_build("cubin"),
            record=gpu_build("json"),
            check=f"results/{GPU_SLUG}/check/{{kernel}}.json",
            builds=ALL_BUILT,
            code=package_modules("cycles", "launch", "peers", "gpu", "gpulock", "cli"),
        output:
            archive_output(f"results/{GPU_SLUG}/cycles/{{kernel}}.json"),
        log:
            f"logs/{GPU_SLUG}/cycles/{{kernel}}.log",
        params:
            **CYCLES_SETTINGS,
        resources:
            gpu=1,
        shell:
            "{PY} -m flashbench cycles --cubin {input.cubin} --record {input.record} " + CYCLES_ARGS

    rule cycles_peer:
        input:
            check=f"results/{GPU_SLUG}/check/{{peer}}.json",
            builds=ALL_BUILT,
            code=package_modules("cycles", "launch", "peers", "gpu", "gpulock", "cli"),
        output:
            archive_output(f"results/{GPU_SLUG}/cycles/{{peer}}.json"),
        log:
            f"logs/{GPU_SLUG}/cycles/{{peer}}.log",
        params:
            peer=lambda w: json.dumps(PEERS[w.peer].as_dict()),
            **CYCLES_SETTINGS,
        resources:
            gpu=1,
        shell:
            "{PY} -m flashbench cycles --peer {params.peer:q} " + CYCLES_ARGS

    rule cycles:
        input:
            run_records("cycles"),

elif GPU_MODE:

    rule cycles:
        log:
            "logs/cycles-skipped.log",
        params:
            note=CYCLES_NOTE,
        shell:
            "echo 'cycles: {params.note}' | tee {log}"
