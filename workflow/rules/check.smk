# check: each kernel against the fp32 reference on fresh random inputs (GPU).

if GPU_MODE:

    rule check_kernel:
        input:
            cubin=f"build/{GPU_ARCH}/{{kernel}}.cubin",
            record=f"build/{GPU_ARCH}/{{kernel}}.json",
            code=package_modules("check", "launch", "peers", "gpu", "cli"),
        output:
            f"results/{GPU_SLUG}/check/{{kernel}}.json",
        log:
            f"logs/{GPU_SLUG}/check/{{kernel}}.log",
        params:
            shapes=json.dumps([s.as_dict() for s in SETTINGS.check_shapes]),
            tolerance=SETTINGS.tolerance,
        resources:
            gpu=1,
        shell:
            "{PY} -m flashbench check --cubin {input.cubin} --record {input.record} --shapes {params.shapes:q}"
            " --tolerance {params.tolerance} --out {output} 2>&1 | tee {log}"

    rule check_peer:
        input:
            code=package_modules("check", "launch", "peers", "gpu", "cli"),
        output:
            f"results/{GPU_SLUG}/check/{{peer}}.json",
        log:
            f"logs/{GPU_SLUG}/check/{{peer}}.log",
        params:
            peer=lambda w: json.dumps(PEERS[w.peer].as_dict()),
            shapes=json.dumps([s.as_dict() for s in SETTINGS.check_shapes]),
            tolerance=SETTINGS.tolerance,
        resources:
            gpu=1,
        shell:
            "{PY} -m flashbench check --peer {params.peer:q} --shapes {params.shapes:q}"
            " --tolerance {params.tolerance} --out {output} 2>&1 | tee {log}"

    rule check:
        input:
            run_records("check"),
