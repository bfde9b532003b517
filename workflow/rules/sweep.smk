# sweep: TFLOPS against the sequence length, every kernel and peer that passed its check (GPU).

if GPU_MODE and SETTINGS.sweep:

    rule sweep_kernel:
        input:
            cubin=gpu_build("cubin"),
            record=gpu_build("json"),
            check=f"results/{GPU_SLUG}/check/{{kernel}}.json",
            builds=ALL_BUILT,
            code=command_code("sweep"),
        output:
            archive_output(f"results/{GPU_SLUG}/sweep/{{kernel}}.json"),
        log:
            f"logs/{GPU_SLUG}/sweep/{{kernel}}.log",
        params:
            settings=settings_of("sweep"),
        resources:
            gpu=1,
        shell:
            "{PY} -m flashbench sweep --settings {SETTINGS_FILE} --cubin {input.cubin} --record {input.record}"
            " --check {input.check} --out {output} 2>&1 | tee {log}"

    rule sweep_peer:
        input:
            check=f"results/{GPU_SLUG}/check/{{peer}}.json",
            builds=ALL_BUILT,
            code=command_code("sweep"),
        output:
            archive_output(f"results/{GPU_SLUG}/sweep/{{peer}}.json"),
        log:
            f"logs/{GPU_SLUG}/sweep/{{peer}}.log",
        params:
            settings=settings_of("sweep"),
        resources:
            gpu=1,
        shell:
            "{PY} -m flashbench sweep --settings {SETTINGS_FILE} --peer {wildcards.peer} --check {input.check}"
            " --out {output} 2>&1 | tee {log}"

    rule sweep:
        input:
            run_records("sweep"),

elif GPU_MODE:

    rule sweep:
        log:
            "logs/sweep-not-configured.log",
        shell:
            "echo 'sweep: no sweep in config.yaml' | tee {log}"
