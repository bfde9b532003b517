# check: each kernel against the fp32 reference on fresh random inputs (GPU).

if GPU_MODE:

    rule check_kernel:
        input:
            cubin=gpu_build("cubin"),
            record=gpu_build("json"),
            builds=ALL_BUILT,
            code=command_code("check"),
        output:
            archive_output(f"results/{GPU_SLUG}/check/{{kernel}}.json"),
        log:
            f"logs/{GPU_SLUG}/check/{{kernel}}.log",
        params:
            settings=settings_of("check"),
        resources:
            gpu=1,
        shell:
            "{PY} -m flashbench check --settings {SETTINGS_FILE} --cubin {input.cubin} --record {input.record}"
            " --out {output} 2>&1 | tee {log}"

    rule check_peer:
        input:
            builds=ALL_BUILT,
            code=command_code("check"),
        output:
            archive_output(f"results/{GPU_SLUG}/check/{{peer}}.json"),
        log:
            f"logs/{GPU_SLUG}/check/{{peer}}.log",
        params:
            settings=settings_of("check"),
            libraries=lambda w: LIBRARIES[w.peer],  # not passed on: a change reruns the check (see LIBRARIES)
        resources:
            gpu=1,
        shell:
            "{PY} -m flashbench check --settings {SETTINGS_FILE} --peer {wildcards.peer} --out {output} 2>&1 | tee {log}"

    rule check:
        input:
            run_records("check"),
