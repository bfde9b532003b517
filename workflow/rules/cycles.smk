# cycles: Nsight Compute's cycle counts, every kernel and peer at the case and the head-to-head's
# contestants at each of its points too (GPU, and ncu found: see NCU in common.smk).

if CYCLES:

    rule cycles_kernel:
        input:
            unpack(kernel_inputs("cycles")),
        output:
            archive_output(f"results/{GPU_SLUG}/cycles/{{build}}.json"),
        log:
            f"logs/{GPU_SLUG}/cycles/{{build}}.log",
        params:
            files=lambda w: kernel_files(w),
            ncu=NCU,
            settings=settings_of("cycles"),
        resources:
            gpu=1,
        shell:
            "{PY} -m flashbench cycles --settings {SETTINGS_FILE} --cubin {params.files[cubin]} --record {params.files[record]}"
            " --ncu {params.ncu:q} --check {params.files[check]} --out {output} --depends-on {input} 2>&1 | tee {log}"

    rule cycles_peer:
        input:
            unpack(peer_inputs("cycles")),
        output:
            archive_output(f"results/{GPU_SLUG}/cycles/{{peer}}.json"),
        log:
            f"logs/{GPU_SLUG}/cycles/{{peer}}.log",
        params:
            files=lambda w: peer_files(w),
            ncu=NCU,
            settings=settings_of("cycles"),
        resources:
            gpu=1,
        shell:
            "{PY} -m flashbench cycles --settings {SETTINGS_FILE} --peer {wildcards.peer} --ncu {params.ncu:q}"
            " --check {params.files[check]} --out {output} --depends-on {input} 2>&1 | tee {log}"

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
