# bench: time each kernel that passed its check, at the write-up's case (GPU).

if GPU_MODE:

    rule bench_kernel:
        input:
            cubin=gpu_build("cubin"),
            record=gpu_build("json"),
            check=f"results/{GPU_SLUG}/check/{{kernel}}.json",
            builds=ALL_BUILT,
            code=command_code("bench"),
        output:
            archive_output(f"results/{GPU_SLUG}/bench/{{kernel}}.json"),
        log:
            f"logs/{GPU_SLUG}/bench/{{kernel}}.log",
        params:
            settings=settings_of("bench"),
        resources:
            gpu=1,
        shell:
            "{PY} -m flashbench bench --settings {SETTINGS_FILE} --cubin {input.cubin} --record {input.record}"
            " --check {input.check} --out {output} 2>&1 | tee {log}"

    rule bench_peer:
        input:
            check=f"results/{GPU_SLUG}/check/{{peer}}.json",
            builds=ALL_BUILT,
            code=command_code("bench"),
        output:
            archive_output(f"results/{GPU_SLUG}/bench/{{peer}}.json"),
        log:
            f"logs/{GPU_SLUG}/bench/{{peer}}.log",
        params:
            settings=settings_of("bench"),
        resources:
            gpu=1,
        shell:
            "{PY} -m flashbench bench --settings {SETTINGS_FILE} --peer {wildcards.peer} --check {input.check}"
            " --out {output} 2>&1 | tee {log}"

    rule bench:
        input:
            run_records("bench"),
