# head_to_head: the headline versions against the rivals, paired in one process per point: the case
# and every swept S, in each configuration the headline runs in (GPU). Verdicts come from the rounds'
# paired ratios (flashbench/headtohead.py).

if GPU_MODE and HEAD_TO_HEAD_POINTS:

    def contestants_of(point):
        """The runs a point pits against each other, in its configuration (config.Settings.contestants)."""
        return SETTINGS.contestants(HEAD_TO_HEAD_POINTS[point][1])

    def contestant_builds(point):
        return [name for name in contestants_of(point) if name in BUILDS]

    rule head_to_head_point:
        input:
            unpack(measured("head_to_head", lambda w: {
                "checks": run_records("check", contestants_of(w.point)),
                "cubins": [build_of(name, "cubin") for name in contestant_builds(w.point)],
                "records": [build_of(name, "json") for name in contestant_builds(w.point)],
                "code": command_code("head-to-head"),
            }, built=lambda w: contestant_builds(w.point))),
        output:
            archive_output(f"results/{GPU_SLUG}/head_to_head/{{point}}.json"),
        log:
            f"logs/{GPU_SLUG}/head_to_head/{{point}}.log",
        wildcard_constraints:
            point="|".join(map(re.escape, HEAD_TO_HEAD_POINTS)),
        params:
            S=lambda w: HEAD_TO_HEAD_POINTS[w.point][0].S,
            configuration=lambda w: HEAD_TO_HEAD_POINTS[w.point][1].name,
            checks=lambda w: run_records("check", contestants_of(w.point)),
            cubins=lambda w: [build_of(name, "cubin") for name in contestant_builds(w.point)],
            settings=settings_of("head_to_head"),
        resources:
            gpu=1,
        shell:
            "{PY} -m flashbench head-to-head --settings {SETTINGS_FILE} --S {params.S}"
            " --configuration {params.configuration} --checks {params.checks}"
            " --cubins {params.cubins} --out {output} --depends-on {input} 2>&1 | tee {log}"

    rule head_to_head:
        input:
            expand(f"results/{GPU_SLUG}/head_to_head/{{point}}.json", point=HEAD_TO_HEAD_POINTS),

elif GPU_MODE:

    rule head_to_head:
        log:
            "logs/head-to-head-not-configured.log",
        shell:
            "echo 'head_to_head: no headline or head_to_head in config.yaml' | tee {log}"
