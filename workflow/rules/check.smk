# check: each kernel against the fp32 reference on fresh random inputs (GPU).

if GPU_MODE:

    CHECK_PARAMS = dict(
        shapes=json.dumps([s.as_dict() for s in SETTINGS.check_shapes]),
        inputs=",".join(SETTINGS.check_inputs),
        smallest=json.dumps(SETTINGS.check_smallest),
        factor=SETTINGS.check_factor,
        tolerance=SETTINGS.tolerance,
    )
    CHECK_ARGS = (
        "--shapes {params.shapes:q} --inputs {params.inputs:q} --smallest {params.smallest:q} --factor {params.factor}"
        " --tolerance {params.tolerance} --out {output} 2>&1 | tee {log}"
    )

    rule check_kernel:
        input:
            cubin=gpu_build("cubin"),
            record=gpu_build("json"),
            builds=ALL_BUILT,
            code=package_modules("check", "launch", "peers", "gpu", "gpulock", "cli"),
        output:
            archive_output(f"results/{GPU_SLUG}/check/{{kernel}}.json"),
        log:
            f"logs/{GPU_SLUG}/check/{{kernel}}.log",
        params:
            **CHECK_PARAMS,
        resources:
            gpu=1,
        shell:
            "{PY} -m flashbench check --cubin {input.cubin} --record {input.record} " + CHECK_ARGS

    rule check_peer:
        input:
            builds=ALL_BUILT,
            code=package_modules("check", "launch", "peers", "gpu", "gpulock", "cli"),
        output:
            archive_output(f"results/{GPU_SLUG}/check/{{peer}}.json"),
        log:
            f"logs/{GPU_SLUG}/check/{{peer}}.log",
        params:
            peer=lambda w: json.dumps(PEERS[w.peer].as_dict()),
            libraries=lambda w: LIBRARIES[w.peer],  # not passed on: a change reruns the check (see LIBRARIES)
            **CHECK_PARAMS,
        resources:
            gpu=1,
        shell:
            "{PY} -m flashbench check --peer {params.peer:q} " + CHECK_ARGS

    rule check:
        input:
            run_records("check"),
