# profile: Nsight Compute on each kernel at the case (GPU, and ncu found: see NCU in common.smk).

if PROFILE:

    rule profile_kernel:
        input:
            unpack(measured("profile", lambda w: {
                **kernel_files(w),
                "source": KERNELS[w.kernel].source,  # the stalls are attributed to its lines
                "code": command_code("profile"),
            })),
        output:
            archive_output(f"results/{GPU_SLUG}/profile/{{kernel}}.json"),
        log:
            f"logs/{GPU_SLUG}/profile/{{kernel}}.log",
        params:
            files=lambda w: kernel_files(w),
            ncu=NCU,
            settings=settings_of("profile"),
        resources:
            gpu=1,
        shell:
            "{PY} -m flashbench profile --settings {SETTINGS_FILE} --ncu {params.ncu:q} --cubin {params.files[cubin]}"
            " --record {params.files[record]} --check {params.files[check]} --out {output} --depends-on {input} 2>&1 | tee {log}"

    rule profile:
        input:
            run_records("profile", KERNELS),

elif GPU_MODE:

    rule profile:
        log:
            "logs/profile-skipped.log",
        params:
            note=f"profile: {PROFILE_NOTE}",
        shell:
            "echo {params.note:q} | tee {log}"
