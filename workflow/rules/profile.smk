# profile: Nsight Compute on each kernel at the case (GPU, and ncu found: see NCU in common.smk).

if PROFILE:

    rule profile_kernel:
        input:
            cubin=gpu_build("cubin"),
            record=gpu_build("json"),
            check=f"results/{GPU_SLUG}/check/{{kernel}}.json",
            source=lambda w: KERNELS[w.kernel].source,  # the stalls are attributed to its lines
            builds=ALL_BUILT,
            code=command_code("profile"),
        output:
            archive_output(f"results/{GPU_SLUG}/profile/{{kernel}}.json"),
        log:
            f"logs/{GPU_SLUG}/profile/{{kernel}}.log",
        params:
            ncu=NCU,
            settings=settings_of("profile"),
        resources:
            gpu=1,
        shell:
            "{PY} -m flashbench profile --settings {SETTINGS_FILE} --ncu {params.ncu:q} --cubin {input.cubin}"
            " --record {input.record} --check {input.check} --out {output} 2>&1 | tee {log}"

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
