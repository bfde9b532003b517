# head_to_head: the headline versions against the rivals, paired in one process per point: the case
# and every swept S (GPU). Verdicts come from the rounds' paired ratios (flashbench/headtohead.py).

if GPU_MODE and HEAD_TO_HEAD_SHAPES:

    def contestants(w):
        """Each contestant's check record, and a kernel's build (the job reruns when one changes)."""
        files = {f"check_{name}": f"results/{GPU_SLUG}/check/{name}.json" for name in CONTESTANTS}
        for name in SETTINGS.headline:
            files |= {f"cubin_{name}": build_of(name, "cubin"), f"record_{name}": build_of(name, "json")}
        return files

    def contestants_json(w):
        return json.dumps(
            [
                {"check": f"results/{GPU_SLUG}/check/{name}.json"}
                | (
                    {"peer": PEERS[name].as_dict()}
                    if name in PEERS
                    else {"cubin": build_of(name, "cubin"), "record": build_of(name, "json")}
                )
                for name in CONTESTANTS
            ]
        )

    rule head_to_head_point:
        input:
            unpack(contestants),
            builds=ALL_BUILT,
            code=package_modules("headtohead", "timing", "launch", "peers", "gpu", "gpulock", "clocks", "cli"),
        output:
            archive_output(f"results/{GPU_SLUG}/head_to_head/{{point}}.json"),
        log:
            f"logs/{GPU_SLUG}/head_to_head/{{point}}.log",
        wildcard_constraints:
            point="|".join(HEAD_TO_HEAD_SHAPES),
        params:
            contestants=contestants_json,
            shape=lambda w: json.dumps(HEAD_TO_HEAD_SHAPES[w.point].as_dict()),
            case=json.dumps(SETTINGS.case.as_dict()),
            settings=json.dumps(SETTINGS.head_to_head),
        resources:
            gpu=1,
        shell:
            "{PY} -m flashbench head-to-head --contestants {params.contestants:q} --shape {params.shape:q}"
            " --case {params.case:q} --settings {params.settings:q} --out {output} 2>&1 | tee {log}"

    rule head_to_head:
        input:
            expand(f"results/{GPU_SLUG}/head_to_head/{{point}}.json", point=HEAD_TO_HEAD_SHAPES),

elif GPU_MODE:

    rule head_to_head:
        log:
            "logs/head-to-head-not-configured.log",
        shell:
            "echo 'head_to_head: no headline or head_to_head in config.yaml' | tee {log}"
