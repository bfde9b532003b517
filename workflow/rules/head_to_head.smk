# head_to_head: the headline versions against the rivals, paired in one process per point: the case
# and every swept S (GPU). Verdicts come from the rounds' paired ratios (flashbench/headtohead.py).

if GPU_MODE and HEAD_TO_HEAD_SHAPES:

    def contestant(name):
        """A contestant as the head-to-head command takes it: its check record, and a peer's config
        entry or a kernel's build."""
        check = {"check": f"results/{GPU_SLUG}/check/{name}.json"}
        if name in PEERS:
            return check | {"peer": PEERS[name].as_dict()}
        return check | {"cubin": build_of(name, "cubin"), "record": build_of(name, "json")}

    def contestants(w):
        """Each contestant's files (the job reruns when one changes)."""
        return {f"{key}_{name}": path for name in CONTESTANTS for key, path in contestant(name).items() if key != "peer"}

    def contestants_json(w):
        return json.dumps([contestant(name) for name in CONTESTANTS])

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
