# bench: time each kernel that passed its check, at the write-up's case (GPU).

if GPU_MODE:

    rule bench_kernel:
        input:
            unpack(kernel_inputs("bench")),
        output:
            archive_output(f"results/{GPU_SLUG}/bench/{{build}}.json"),
        log:
            f"logs/{GPU_SLUG}/bench/{{build}}.log",
        params:
            files=lambda w: kernel_files(w),
            settings=settings_of("bench"),
        resources:
            gpu=1,
        shell:
            "{PY} -m flashbench bench --settings {SETTINGS_FILE} --cubin {params.files[cubin]} --record {params.files[record]}"
            " --check {params.files[check]} --out {output} --depends-on {input} 2>&1 | tee {log}"

    rule bench_peer:
        input:
            unpack(peer_inputs("bench")),
        output:
            archive_output(f"results/{GPU_SLUG}/bench/{{peer}}.json"),
        log:
            f"logs/{GPU_SLUG}/bench/{{peer}}.log",
        params:
            files=lambda w: peer_files(w),
            settings=settings_of("bench"),
        resources:
            gpu=1,
        shell:
            "{PY} -m flashbench bench --settings {SETTINGS_FILE} --peer {wildcards.peer} --check {params.files[check]}"
            " --out {output} --depends-on {input} 2>&1 | tee {log}"

    rule bench:
        input:
            run_records("bench"),
