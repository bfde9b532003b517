# head_to_head: the headline versions against the rivals, paired in one process per point: the case
# and every swept S (GPU). Verdicts come from the rounds' paired ratios (flashbench/headtohead.py).

if GPU_MODE and HEAD_TO_HEAD_SHAPES:

    # Each contestant's check record, and each kernel's build with its compile record beside it
    CONTESTANT_KERNELS = [name for name in SETTINGS.contestants if name in KERNELS]
    CONTESTANT_CHECKS = run_records("check", SETTINGS.contestants)
    CONTESTANT_CUBINS = [build_of(name, "cubin") for name in CONTESTANT_KERNELS]

    rule head_to_head_point:
        input:
            unpack(measured("head_to_head", lambda w: {
                "checks": CONTESTANT_CHECKS,
                "cubins": CONTESTANT_CUBINS,
                "records": [build_of(name, "json") for name in CONTESTANT_KERNELS],
                "code": command_code("head-to-head"),
            }, built=lambda w: CONTESTANT_KERNELS)),
        output:
            archive_output(f"results/{GPU_SLUG}/head_to_head/{{point}}.json"),
        log:
            f"logs/{GPU_SLUG}/head_to_head/{{point}}.log",
        wildcard_constraints:
            point="|".join(HEAD_TO_HEAD_SHAPES),
        params:
            S=lambda w: HEAD_TO_HEAD_SHAPES[w.point].S,
            checks=CONTESTANT_CHECKS,
            cubins=CONTESTANT_CUBINS,
            settings=settings_of("head_to_head"),
        resources:
            gpu=1,
        shell:
            "{PY} -m flashbench head-to-head --settings {SETTINGS_FILE} --S {params.S} --checks {params.checks}"
            " --cubins {params.cubins} --out {output} --depends-on {input} 2>&1 | tee {log}"

    rule head_to_head:
        input:
            expand(f"results/{GPU_SLUG}/head_to_head/{{point}}.json", point=HEAD_TO_HEAD_SHAPES),

elif GPU_MODE:

    rule head_to_head:
        log:
            "logs/head-to-head-not-configured.log",
        shell:
            "echo 'head_to_head: no headline or head_to_head in config.yaml' | tee {log}"
