# sweep: TFLOPS against the sequence length, every kernel and peer that passed its check (GPU).

if GPU_MODE and SETTINGS.sweep:

    SWEEP_SETTINGS = dict(
        shapes=json.dumps([s.as_dict() for s in SETTINGS.sweep_shapes()]),
        steps=SETTINGS.sweep["steps"],
        case_s=SETTINGS.case.S,
        repeats=SETTINGS.sweep["repeats"],
        warmup=SETTINGS.sweep["warmup"],
        graph_replays=SETTINGS.sweep["graph_replays"],
    )
    SWEEP_ARGS = (
        "--check {input.check} --shapes {params.shapes:q} --steps {params.steps} --case-s {params.case_s}"
        " --repeats {params.repeats}"
        " --warmup {params.warmup} --graph-replays {params.graph_replays} --out {output} 2>&1 | tee {log}"
    )

    rule sweep_kernel:
        input:
            cubin=gpu_build("cubin"),
            record=gpu_build("json"),
            check=f"results/{GPU_SLUG}/check/{{kernel}}.json",
            builds=ALL_BUILT,
            code=package_modules("timing", "launch", "peers", "gpu", "gpulock", "clocks", "cli"),
        output:
            archive_output(f"results/{GPU_SLUG}/sweep/{{kernel}}.json"),
        log:
            f"logs/{GPU_SLUG}/sweep/{{kernel}}.log",
        params:
            **SWEEP_SETTINGS,
        resources:
            gpu=1,
        shell:
            "{PY} -m flashbench sweep --cubin {input.cubin} --record {input.record} " + SWEEP_ARGS

    rule sweep_peer:
        input:
            check=f"results/{GPU_SLUG}/check/{{peer}}.json",
            builds=ALL_BUILT,
            code=package_modules("timing", "launch", "peers", "gpu", "gpulock", "clocks", "cli"),
        output:
            archive_output(f"results/{GPU_SLUG}/sweep/{{peer}}.json"),
        log:
            f"logs/{GPU_SLUG}/sweep/{{peer}}.log",
        params:
            peer=lambda w: json.dumps(PEERS[w.peer].as_dict()),
            **SWEEP_SETTINGS,
        resources:
            gpu=1,
        shell:
            "{PY} -m flashbench sweep --peer {params.peer:q} " + SWEEP_ARGS

    rule sweep:
        input:
            run_records("sweep"),

elif GPU_MODE:

    rule sweep:
        log:
            "logs/sweep-not-configured.log",
        shell:
            "echo 'sweep: no sweep in config.yaml' | tee {log}"
