# sweep: TFLOPS against the sequence length, every kernel and peer that passed its check (GPU).

if GPU_MODE and SETTINGS.sweep:

    rule sweep_kernel:
        input:
            unpack(kernel_inputs("sweep")),
        output:
            archive_output(f"results/{GPU_SLUG}/sweep/{{build}}.json"),
        log:
            f"logs/{GPU_SLUG}/sweep/{{build}}.log",
        params:
            files=lambda w: kernel_files(w),
            settings=settings_of("sweep"),
        resources:
            gpu=1,
        shell:
            "{PY} -m flashbench sweep --settings {SETTINGS_FILE} --cubin {params.files[cubin]} --record {params.files[record]}"
            " --check {params.files[check]} --out {output} --depends-on {input} 2>&1 | tee {log}"

    rule sweep_peer:
        input:
            unpack(peer_inputs("sweep")),
        output:
            archive_output(f"results/{GPU_SLUG}/sweep/{{peer}}.json"),
        log:
            f"logs/{GPU_SLUG}/sweep/{{peer}}.log",
        params:
            files=lambda w: peer_files(w),
            settings=settings_of("sweep"),
        resources:
            gpu=1,
        shell:
            "{PY} -m flashbench sweep --settings {SETTINGS_FILE} --peer {wildcards.peer} --check {params.files[check]}"
            " --out {output} --depends-on {input} 2>&1 | tee {log}"

    rule sweep:
        input:
            run_records("sweep"),

elif GPU_MODE:

    rule sweep:
        log:
            "logs/sweep-not-configured.log",
        shell:
            "echo 'sweep: no sweep in config.yaml' | tee {log}"
