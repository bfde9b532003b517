# check: each kernel build and peer, in each configuration it runs in, against the fp32 reference (the
# configuration's mask applied) on fresh random inputs (GPU).

if GPU_MODE:

    rule check_kernel:
        input:
            unpack(kernel_inputs("check", check=False)),
        output:
            archive_output(f"results/{GPU_SLUG}/check/{{build}}.json"),
        log:
            f"logs/{GPU_SLUG}/check/{{build}}.log",
        params:
            files=lambda w: kernel_files(w, check=False),
            settings=settings_of("check"),
        resources:
            gpu=1,
        shell:
            "{PY} -m flashbench check --settings {SETTINGS_FILE} --cubin {params.files[cubin]} --record {params.files[record]}"
            " --out {output} --depends-on {input} 2>&1 | tee {log}"

    rule check_peer:
        input:
            unpack(peer_inputs("check", check=False)),
        output:
            archive_output(f"results/{GPU_SLUG}/check/{{peer}}.json"),
        log:
            f"logs/{GPU_SLUG}/check/{{peer}}.log",
        params:
            files=lambda w: peer_files(w, check=False),
            settings=settings_of("check"),
            libraries=lambda w: LIBRARIES[w.peer],  # not passed on: a change reruns the check (see LIBRARIES)
        resources:
            gpu=1,
        shell:
            "{PY} -m flashbench check --settings {SETTINGS_FILE} --peer {wildcards.peer} --out {output} --depends-on {input} 2>&1 | tee {log}"

    rule check:
        input:
            run_records("check"),
