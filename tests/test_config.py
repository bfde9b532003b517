import copy
import re
from dataclasses import replace

import pytest
import yaml

from flashbench.config import ConfigError, digest, load, load_settings, validate, write_settings

from conftest import ROOT, snakemake

CONFIG = yaml.safe_load((ROOT / "config.yaml").read_text())


def edited(edit) -> dict:
    config = copy.deepcopy(CONFIG)
    edit(config)
    return config


def test_the_shipped_config_is_valid():
    settings = validate(CONFIG, root=ROOT)
    assert [k.name for k in settings.kernels] == CONFIG["versions"]
    assert settings.check_shapes[0] == settings.case  # the timed case is always checked
    assert len(settings.check_shapes) >= 4
    assert settings.baseline == "sdpa_auto" and settings.baseline in [p.name for p in settings.peers]
    assert [s.S for s in settings.sweep_shapes()] == [512, 1024, 2048, 4096, 8192, 16384, 4000]  # sweep.ragged last
    assert [s.S for s in settings.headline_shapes()] == [1024, 512, 2048, 4096, 8192, 16384]  # not the ragged S
    # the first configuration's points: none below every goal's S
    assert [s.S for s in settings.headline_shapes(settings.configurations[0])] == [1024, 2048, 4096, 8192, 16384]
    assert {s.B for s in settings.sweep_shapes()} == {settings.case.B}
    assert settings.goal.rivals == ("cudnn", "auto") and set(settings.goal.next.factors) == {"cudnn", "flash_attn_cute"}


@pytest.mark.parametrize("edit, message", [
    (lambda c: c["versions"].insert(1, "v99"), r"'versions\[1\]': unknown version 'v99'"),
    (lambda c: c["case"].update(S=1000), r"'case.S': 1000 is not a multiple of 128"),
    (lambda c: c["check"]["shapes"][1].update(S=200), r"'check.shapes\[1\].S': 200 is not a multiple of 128"),
    (lambda c: c["case"].update(D=64), r"'case.D': must be 128, not 64: the kernels are written for head dim 128 only: "
                                        r"their tiles, swizzle and fragments are sized for it$"),
    (lambda c: c["check"]["shapes"][0].update(D=96), r"'check.shapes\[0\].D': must be 128, not 96: the kernels are"),
    (lambda c: c["archs"].append("sm_75"), r"'archs\[2\]': 'sm_75' is not one of"),
    (lambda c: c["bench"].update(steps="100x"), r"'bench.steps': '100x' is not of type 'integer'"),
    (lambda c: c["check"].update(tolerance="1e-2"), r"'check.tolerance': '1e-2' is not of type 'number'"),
    (lambda c: c["check"].update(tolerance=0.5), r"'check.tolerance': 0.5 is greater than the maximum"),
    (lambda c: c["check"].update(factor=10), r"'check.factor': 10 is greater than the maximum of 4"),
    (lambda c: c["check"].update(factor=float("nan")), r"'check.factor': nan is not a finite number$"),
    (lambda c: c["check"].update(tolerance=float("nan")), r"'check.tolerance': nan is not a finite number$"),
    (lambda c: c["check"].update(tolerance=float("-inf")), r"'check.tolerance': -inf is not a finite number$"),
    (lambda c: c["kernels"]["v12"].update(published_tflops=float("inf")),
     r"'kernels.v12.published_tflops': inf is not a finite number$"),
    (lambda c: c["check"].pop("factor"), r"'check.factor': missing$"),
    (lambda c: c["check"].update(inputs=["normal", "zeros"]), r"'check.inputs\[1\]': 'zeros' is not one of"),
    (lambda c: c["check"]["smallest"].update(B=2), r"'check.smallest': B\*H = 10 is even"),
    (lambda c: c.update(colour="blue"), r"'\(top level\)': Additional properties are not allowed \('colour'"),
    (lambda c: c["kernels"]["v11"].update(source="kernels/nope.cu"), r"'kernels.v11.source': no such file"),
    (lambda c: c["kernels"]["v11"].update(kind="ablation"), r"'kernels.v11.parent': an ablation must name"),
    (lambda c: c["kernels"]["br128"].update(parent="v10"), r"'kernels.br128.parent': unknown kernel 'v10'$"),
    (lambda c: c["headline"].append("v10"), r"'headline\[2\]': 'v10' is not one of the versions run$"),
    (lambda c: c.pop("headline"), r"'head_to_head': needs the versions it compares \(config key 'headline'\)$"),
    (lambda c: c["head_to_head"]["rivals"].append("cublas"), r"'head_to_head.rivals\[3\]': 'cublas' is not one of the "
                                                            r"peers$"),
    (lambda c: c.update(gpu="NVIDIA H200"), r"'gpu': 'NVIDIA H200' does not match"),
    (lambda c: c.update(gpu_arch="sm_80"), r"'gpu_arch': 'sm_80' is not valid"),
    (lambda c: c["check"].update(shapes=c["check"]["shapes"][:2]), r"'check.shapes': .* is too short"),
    (lambda c: c["check"]["shapes"].append(dict(c["case"])) or c["check"]["shapes"].pop(0),
     r"'check.shapes': needs at least 3 shapes other than the case, has 2"),
    (lambda c: c["peers"]["sdpa_flash"].update(backend="triton"), r"'peers.sdpa_flash.backend': 'triton' is not one of"),
    (lambda c: c["peers"].update(v11={"backend": "auto", "change": "x"}), r"'peers.v11': a kernel has that name too"),
    (lambda c: c.update(baseline="cublas"), r"'baseline': 'cublas' is not one of the peers"),
    (lambda c: c["sweep"].update(S=[512, 1000]), r"'sweep.S\[1\]': 1000 is not a multiple of 128"),
    (lambda c: c["check"]["ragged"][1].update(S=1024), r"'check.ragged\[1\].S': 1024 is not allowed: a multiple of 128"),
    (lambda c: c["sweep"].update(ragged=[9000]),
     r"'sweep.ragged\[0\]': 9000 is held against the next multiple of 128, 9088, which is not one of sweep.S"),
    (lambda c: c["sweep"]["ragged_pair"].update(rounds=2), r"'sweep.ragged_pair.rounds': 2 is less than the minimum of 5"),
    (lambda c: c["sweep"]["ragged_pair"].pop("lead_in_ms"), r"'sweep.ragged_pair.lead_in_ms': missing$"),
    (lambda c: c["sweep"]["ragged_pair"].update(configurations=["dense", "casual"]),
     r"'sweep.ragged_pair.configurations\[1\]': unknown configuration 'casual' \(defined under configurations: dense, "),
    (lambda c: c["sweep"]["ragged_pair"].update(min_timing_ms=float("inf")),
     r"'sweep.ragged_pair.min_timing_ms': inf is not a finite number$"),
    (lambda c: c.update(ncu=True), r"'ncu': True is not allowed: Nsight Compute for the profile stage"),
    (lambda c: c["peers"]["unfused"].update(max_seq_len=512), r"'peers.unfused.max_seq_len': 512 is below the case's"),
    (lambda c: c.update(ncu="false"), r"'ncu': 'false' is a string; write false"),
    # nvcc hands -D values and flags on through a shell: nothing there may run as a command
    (lambda c: c["kernels"]["br128"]["defines"].update(Y="$(touch /tmp/x)"),
     r"'kernels.br128.defines.Y': '\$\(touch /tmp/x\)' is not valid under any of the given schemas"),
    (lambda c: c["kernels"]["br128"]["defines"].update(Z="`touch /tmp/y`"), r"'kernels.br128.defines.Z': '`touch"),
    (lambda c: c["kernels"]["br128"]["defines"].update(W="1; touch /tmp/z"), r"'kernels.br128.defines.W': '1; touch"),
    (lambda c: c["nvcc_flags"].append("-DY=$(touch /tmp/x)"), r"'nvcc_flags\[3\]': '-DY=\$\(touch /tmp/x\)' is not allowed"),
    (lambda c: c["nvcc_flags"].append("-O3;touch"), r"'nvcc_flags\[3\]': '-O3;touch' is not allowed"),
])
def test_bad_config_names_the_key(edit, message):
    with pytest.raises(ConfigError, match=message):
        validate(edited(edit), root=ROOT)


NVCC_REFUSAL = "is not allowed: a kernel build takes only -O0..-O3, "


@pytest.mark.parametrize("flag", [
    "-MD", "-MF=results/nvidia-h200/summary.csv",  # a dependency file, written over an archived table
    "-ccbin=/tmp/any-program",  # run as the host compiler
    "-odir=/tmp/elsewhere", "--output-directory=/tmp/elsewhere", "--options-file=/tmp/more",
    "-Xptxas=-v,--output-file=/tmp/x", "-Xptxas=-v,", "-Xptxas",  # bare, it takes the next flag for ptxas
    "-O4", "-maxrregcount=0", "-ftz=yes", "-std=c++17 -ccbin=/bin/sh",
])
def test_an_nvcc_flag_outside_what_a_build_needs_is_a_config_error_naming_it(flag):
    with pytest.raises(ConfigError) as e:
        validate(edited(lambda c: c["nvcc_flags"].append(flag)), root=ROOT)
    assert str(e.value).startswith(f"config key 'nvcc_flags[3]': {flag!r} {NVCC_REFUSAL}")
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("flag", [
    "-O0", "-O3", "-std=c++17", "--std=c++20", "-lineinfo", "--generate-line-info", "-G", "--device-debug",
    "-use_fast_math", "--use_fast_math", "-maxrregcount=128", "--maxrregcount=64", "-extra-device-vectorization",
    "--extra-device-vectorization", "-ftz=true", "--ftz=false", "-prec-div=false", "--prec-sqrt=true", "-fmad=false",
    "--fmad=true", "-Xptxas=-v", "-Xptxas=-O3,-warn-spills", "--ptxas-options=--warn-on-spills,-Werror",
    "-Xptxas=-warn-lmem-usage,-warn-double-usage,--verbose",
])
def test_the_flags_a_kernel_build_needs_are_taken(flag):
    assert validate(edited(lambda c: c["nvcc_flags"].append(flag)), root=ROOT).nvcc_flags[-1] == flag


@pytest.mark.parametrize("edit, message", [
    (lambda c: c.pop("goal"), r"^config key 'goal': missing$"),
    (lambda c: c.update(goal=None), r"^config key 'goal': None is not of type 'object'$"),
    (lambda c: c["goal"].pop("stretch"), r"^config key 'goal.stretch': missing$"),
    (lambda c: c["goal"].update(stretch=0.9),
     r"^config key 'goal.stretch': 0.9 is less than or equal to the minimum of 1$"),
    (lambda c: c["goal"].update(min_s=4000), r"^config key 'goal.min_s': 4000 is not a multiple of 128$"),
    (lambda c: c["goal"]["rivals"].append("triton"), r"^config key 'goal.rivals\[2\]': 'triton' is not one of"),
    (lambda c: c["goal"]["next"]["factors"].update(triton=1.2),
     r"^config key 'goal.next.factors': 'triton' is not one of"),
    (lambda c: c["goal"]["next"]["factors"].update(cudnn="1.1"),
     r"^config key 'goal.next.factors.cudnn': '1.1' is not of type 'number'$"),
    (lambda c: c["goal"]["next"].update(efficiency_long=85),
     r"^config key 'goal.next.efficiency_long': 85 is greater than the maximum of 1$"),
    (lambda c: c["goal"].update(next_min_s=1024),
     r"^config key 'goal': Additional properties are not allowed \('next_min_s' was unexpected\)$"),
])
def test_a_config_without_its_goal_or_with_a_bad_one_is_refused_in_one_line_naming_the_key(edit, message):
    """The Hopper report's goal is config's, checked by the schema like every other key."""
    with pytest.raises(ConfigError, match=message) as refused:
        validate(edited(edit), root=ROOT)
    assert "\n" not in str(refused.value)


def test_the_settings_file_keeps_configs_order_which_is_the_tables_order(tmp_path):
    # peers listed against the alphabet: a settings file that sorted its keys would reorder the tables
    config = edited(lambda c: c.update(peers=dict(reversed(list(c["peers"].items())))))
    settings = load_settings(write_settings(config, tmp_path))
    assert [p.name for p in settings.peers] == list(config["peers"]) != sorted(config["peers"])
    assert [k.name for k in settings.kernels] == CONFIG["versions"]
    # and the summary, which writes the tables in that order, reruns when only the order changes
    assert digest(validate(config, ROOT).used_by("summarize")) != digest(validate(CONFIG, ROOT).used_by("summarize"))


@pytest.mark.parametrize("value, shown", [(".nan", "nan"), (".inf", "inf"), ("-.inf", "-inf")])
def test_yaml_nan_and_inf_are_not_numbers(tmp_path, value, shown):
    path = tmp_path / "config.yaml"
    path.write_text((ROOT / "config.yaml").read_text().replace("factor: 2\n", f"factor: {value}\n"))
    with pytest.raises(ConfigError, match=rf"^config key 'check.factor': {shown} is not a finite number$"):
        load(path)


def test_a_key_given_twice_is_refused_naming_its_line(tmp_path):
    path = tmp_path / "config.yaml"
    text = (ROOT / "config.yaml").read_text()
    path.write_text(text + "case: {B: 1, H: 64, S: 2048, D: 128}\n")
    with pytest.raises(ConfigError, match=rf"^{re.escape(str(path))} line {text.count(chr(10)) + 1}: key 'case' given "
                                          "twice$"):
        load(path)
    path.write_text(text.replace("  v11:\n", "  v11:\n    source: kernels/v12.cu\n", 1))
    with pytest.raises(ConfigError, match="key 'source' given twice"):
        load(path)


@pytest.mark.parametrize("content, message", [
    (b"- dense\n- causal\n", "must hold a mapping of config keys$"),
    (b"case: {B: 1}\n\xff\xfe\n", "^cannot read .*config.yaml: 'utf-8' codec can't decode"),
    (None, "^cannot read .*config.yaml: .*No such file or directory"),
])
def test_a_config_file_that_is_no_mapping_or_unreadable_is_refused_naming_it(tmp_path, content, message):
    path = tmp_path / "config.yaml"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(ConfigError, match=message):
        load(path)


def test_snakemake_rejects_bad_config_before_any_job(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(edited(lambda c: c["case"].update(S=1000))))
    proc = snakemake(ROOT, "-n", "--configfile", bad)
    assert proc.returncode != 0
    assert "config key 'case.S': 1000 is not a multiple of 128" in proc.stderr + proc.stdout
    assert "Job stats" not in proc.stdout


def test_configurations_name_each_kernel_build_and_peer_run_the_first_keeping_its_names():
    settings = validate(CONFIG, root=ROOT)
    assert [c.name for c in settings.configurations] == ["dense", "causal", "bf16", "gqa", "d64", "d256", "gqa_causal",
                                                         "d64_causal", "d256_causal", "gqa_d64", "gqa_d256", "gqa_d64_causal",
                                                         "gqa_d256_causal",
                                                         "causal_bf16", "gqa_bf16", "d64_bf16", "d256_bf16",
                                                         "gqa_causal_bf16", "d64_causal_bf16", "d256_causal_bf16", "gqa_d64_bf16",
                                                         "gqa_d256_bf16", "gqa_d64_causal_bf16", "gqa_d256_causal_bf16"]
    assert [(c.causal, c.D, c.dtype, c.kv_group) for c in settings.configurations] == [
        (False, 128, "fp16", 1), (True, 128, "fp16", 1), (False, 128, "bf16", 1), (False, 128, "fp16", 8),
        (False, 64, "fp16", 1), (False, 256, "fp16", 1), (True, 128, "fp16", 8), (True, 64, "fp16", 1),
        (True, 256, "fp16", 1), (False, 64, "fp16", 8), (False, 256, "fp16", 8), (True, 64, "fp16", 8),
        (True, 256, "fp16", 8), (True, 128, "bf16", 1), (False, 128, "bf16", 8), (False, 64, "bf16", 1),
        (False, 256, "bf16", 1), (True, 128, "bf16", 8), (True, 64, "bf16", 1), (True, 256, "bf16", 1),
        (False, 64, "bf16", 8), (False, 256, "bf16", 8), (True, 64, "bf16", 8), (True, 256, "bf16", 8)]
    builds = {run.name: run for run in settings.kernel_builds()}
    assert list(builds)[:2] == ["v11", "v12"] and "v25.causal" in builds and "v24.causal" not in builds
    assert builds["v25.causal"].of == "v25" and builds["v25.causal"].configuration.causal
    assert settings.defines("v25.causal") == {"FLASH_CAUSAL": 1} and settings.defines("br128") == {"BLOCK_ROWS": 128}
    assert settings.defines("v25.bf16") == {"FLASH_BF16": 1} and settings.defines("v25.gqa") == {"FLASH_GROUPED_KV": 1}
    assert settings.defines("v25.d64") == {"FLASH_HEAD_DIM": 64} and settings.defines("v25.d256") == {"FLASH_HEAD_DIM": 256}
    assert settings.defines("v25.d256_causal") == {"FLASH_CAUSAL": 1, "FLASH_HEAD_DIM": 256}
    assert settings.defines("v25.d64_causal_bf16") == {"FLASH_CAUSAL": 1, "FLASH_BF16": 1, "FLASH_HEAD_DIM": 64}
    assert settings.defines("v25.gqa_d256_causal") == {"FLASH_CAUSAL": 1, "FLASH_GROUPED_KV": 1, "FLASH_HEAD_DIM": 256}
    assert settings.run("sdpa_cudnn.causal").of == "sdpa_cudnn" and settings.run("sdpa_cudnn").configuration.name == "dense"
    # a peer runs in every configuration unless it names them: the head-to-head's rivals in each (SDPA's
    # automatic dispatch beside cuDNN under the mask alone); the bf16 twins, grouped K/V heads at D=64 and 256,
    # and under the mask grouped K/V heads, D=64 and D=256 race no one, their headline alone
    for configuration in settings.configurations[1:]:
        peers_there = [run.of for run in settings.peer_runs() if run.configuration == configuration]
        unraced = configuration.name not in ("causal", "bf16", "gqa", "d64", "d256")
        assert peers_there == ([] if unraced else ["sdpa_auto", "sdpa_cudnn", "flash_attn_cute"][configuration.name != "causal":])
        assert set(peers_there) == {settings.run(name).of for name in settings.rivals_in(configuration)}
        suffix = f".{configuration.name}"
        assert settings.contestants(configuration) == [f"v25{suffix}", *settings.rivals_in(configuration)]
    # and the runs in table order: each configuration's kernels, then its peers
    assert [run.name for run in settings.runs()][-21:] == ["v25.d256", "sdpa_cudnn.d256", "flash_attn_cute.d256",
                                                           "v25.gqa_causal", "v25.d64_causal", "v25.d256_causal",
                                                           "v25.gqa_d64", "v25.gqa_d256", "v25.gqa_d64_causal",
                                                           "v25.gqa_d256_causal", "v25.causal_bf16", "v25.gqa_bf16",
                                                           "v25.d64_bf16", "v25.d256_bf16", "v25.gqa_causal_bf16",
                                                           "v25.d64_causal_bf16", "v25.d256_causal_bf16",
                                                           "v25.gqa_d64_bf16", "v25.gqa_d256_bf16",
                                                           "v25.gqa_d64_causal_bf16", "v25.gqa_d256_causal_bf16"]
    # the K/V heads of each configured H: 8 of 64 (the case), and one for the check's 3, 5, 8 and 16 (two)
    gqa = settings.configurations[3]
    assert [gqa.kv_heads(H) for H in (64, 16, 8, 5, 3)] == [8, 2, 1, 1, 1]
    # the first configuration's jobs read what they read before configurations; another's reads its own
    assert "configuration" not in settings.used_by("check", "v25")
    assert settings.used_by("check", "v25.causal")["configuration"]["mask"] == "causal"
    assert settings.used_by("compile", "v25.causal")["defines"] == {"FLASH_CAUSAL": 1}


def test_a_run_takes_every_configured_shape_at_its_configurations_head_dim():
    """d64: the case, the check's shapes and its ragged ones, the sweep's, the head-to-head's and the cycle
    counts' at D=64, and what a job reads of the settings says so; the first configuration's at D=128."""
    settings = validate(CONFIG, root=ROOT)
    d64 = settings.configuration("d64")
    shaped = settings.in_configuration(d64)
    assert shaped.case == replace(settings.case, D=64) and {s.D for s in shaped.check_shapes} == {64}
    assert {s.D for s in [*shaped.check_ragged, *shaped.sweep_shapes(), *shaped.cycle_shapes("v25.d64")]} == {64}
    assert [(s.B, s.H, s.S) for s in shaped.check_shapes] == [(s.B, s.H, s.S) for s in settings.check_shapes]
    assert shaped.head_to_head_shape(4096) == replace(settings.case, S=4096, D=64)
    assert {s["D"] for s in settings.used_by("check", "v25.d64")["shapes"]} == {64}
    assert settings.used_by("bench", "sdpa_cudnn.d64")["case"]["D"] == 64
    assert settings.used_by("head_to_head", "S4096.d64")["case"]["D"] == 64
    assert settings.used_by("bench", "v25")["case"]["D"] == 128 and settings.in_configuration(
        settings.configurations[0]) == settings


@pytest.mark.parametrize("name, message", [
    ("v24.causal", "v24 does not run in the configuration 'causal' (config key 'kernels.v24.configurations')"),
    ("unfused.causal", "unfused does not run in the configuration 'causal' (config key 'peers.unfused.configurations')"),
    ("v25.sliding", "no configuration named 'sliding'"),
    ("v99.causal", "no kernel or peer named 'v99'"),
])
def test_a_run_outside_the_configurations_is_refused_naming_the_key(name, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        validate(CONFIG, root=ROOT).run(name)


def test_without_configurations_every_kernel_runs_in_the_dense_one():
    bare = {k: v for k, v in copy.deepcopy(CONFIG).items() if k != "configurations"}
    for spec in [*bare["kernels"].values(), *bare["peers"].values(), bare["goal"]["next"], bare["head_to_head"],
                 bare["sweep"]["ragged_pair"]]:
        spec.pop("configurations", None)
    settings = validate(bare, root=ROOT)
    assert [c.name for c in settings.configurations] == ["dense"] and not settings.configurations[0].causal
    assert [run.name for run in settings.kernel_builds()] == [k.name for k in settings.kernels]


@pytest.mark.parametrize("edit, message", [
    (lambda c: c["kernels"]["v25"].update(configurations=["dense", "sliding"]),
     "config key 'kernels.v25.configurations[1]': unknown configuration 'sliding'"),
    (lambda c: c["kernels"]["v25"].update(configurations=["causal"]),
     "config key 'kernels.v25.configurations': every kernel runs in the first configuration, 'dense'"),
    (lambda c: c["peers"]["unfused"].update(configurations=["dense", "sliding"]),
     "config key 'peers.unfused.configurations[1]': unknown configuration 'sliding'"),
    (lambda c: c["goal"]["next"]["configurations"].update(sliding={"long_s": 4096}),
     "config key 'goal.next.configurations.sliding': unknown configuration 'sliding'"),
    (lambda c: c["goal"]["next"]["configurations"]["causal"].update(efficiency_long=1.5),
     "goal.next.configurations.causal.efficiency_long"),
    (lambda c: c["goal"]["next"].update(efficiency_long=None), "goal.next.efficiency_long"),
    (lambda c: c["goal"]["next"]["configurations"]["bf16"]["cycles_of"].update(configuration="bf16"),
     "config key 'goal.next.configurations.bf16.cycles_of.configuration': 'bf16' is not another configuration"),
    (lambda c: c["goal"]["next"]["configurations"]["bf16"]["cycles_of"].update(configuration="fp8"),
     "'fp8' is not another configuration (defined under configurations: dense, causal, bf16, gqa, d64, d256, "
     "gqa_causal, d64_causal, d256_causal, gqa_d64, gqa_d256, gqa_d64_causal, gqa_d256_causal, causal_bf16, gqa_bf16, "
     "d64_bf16, d256_bf16, gqa_causal_bf16, d64_causal_bf16, d256_causal_bf16, gqa_d64_bf16, gqa_d256_bf16, "
     "gqa_d64_causal_bf16, gqa_d256_causal_bf16)"),
    (lambda c: c["configurations"]["gqa"].update(kv_group=0), "configurations.gqa.kv_group"),
    (lambda c: c["configurations"]["bf16"].update(dtype="fp8"), "configurations.bf16.dtype"),
    (lambda c: c["check"]["shapes"].append({"B": 1, "H": 17, "S": 256, "D": 128}),
     "config key 'check.shapes[3].H': 17 query heads do not share the 2 K/V heads"),
    (lambda c: c["peers"]["unfused"].update(configurations=["causal"]),
     "config key 'peers.unfused.configurations': every peer runs in the first configuration, 'dense'"),
    (lambda c: c["head_to_head"]["configurations"].update(sliding={"S": [1024]}),
     "config key 'head_to_head.configurations.sliding': unknown configuration 'sliding'"),
    (lambda c: c["head_to_head"]["configurations"]["d64"].update(rivals=["sdpa_cudnn", "fa3"]),
     "config key 'head_to_head.configurations.d64.rivals[1]': 'fa3' is not one of the peers"),
    (lambda c: c["head_to_head"]["configurations"]["d64"].update(S=[1024, 3000]),
     "config key 'head_to_head.configurations.d64.S[1]': 3000 is not one of sweep.S"),
    (lambda c: c["head_to_head"]["configurations"]["d64"].update(S=[2048, 4096]),
     "config key 'head_to_head.configurations.d64.S': leaves out the case's S=1024"),
    (lambda c: c["head_to_head"]["configurations"]["d64"].update(rivals=["sdpa_cudnn", "sdpa_auto"]),
     "config key 'head_to_head.configurations.d64.rivals[1]': 'sdpa_auto' does not run in 'd64' (its "
     "configurations: dense, causal)"),
    (lambda c: c["head_to_head"]["configurations"]["d64"].update(energy_rounds=-1),
     "head_to_head.configurations.d64.energy_rounds"),
    (lambda c: c["configurations"]["causal"].update(mask="sliding"), "configurations.causal.mask"),
    (lambda c: c["head_to_head"]["configurations"].update(dense={"rivals": []}),
     "config key 'head_to_head.configurations.dense.rivals': none, so no head-to-head in 'dense', where the headline "
     "versions v24, v25 run: they would go uncompared"),
    (lambda c: c["goal"]["next"]["configurations"]["gqa_bf16"].pop("cycles_of"),
     "config key 'goal.next.configurations.gqa_bf16': asks nothing (no factor, efficiency or cycles_of)"),
    (lambda c: c["configurations"]["causal"].update(D=96), "configurations.causal.D"),
    (lambda c: c["goal"]["next"]["configurations"]["causal"].update(
        cycles_of={"configuration": "causal_bf16", "within": 0.02}),
     "config key 'goal.next.configurations.causal.cycles_of': the configurations are held to each other's cycles in a "
     "loop (causal -> causal_bf16 -> causal)"),
    (lambda c: c["goal"]["next"]["configurations"]["gqa_d64"].update(
        cycles_of={"configuration": "gqa_d64_bf16", "within": 0.02}),
     "config key 'goal.next.configurations.gqa_d64.cycles_of': the configurations are held to each other's cycles in a "
     "loop (gqa_d64 -> gqa_d64_bf16 -> gqa_d64)"),
    # a whole number written as a float: Draft 2020-12 counts it an integer, and it would name files S1024.0
    (lambda c: c["case"].update(S=1024.0), "config key 'case.S': 1024.0 is not of type 'integer'"),
    (lambda c: c["bench"].update(steps=100.0), "config key 'bench.steps': 100.0 is not of type 'integer'"),
])
def test_a_bad_configuration_is_refused_naming_the_key(edit, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        validate(edited(edit), root=ROOT)



def test_the_kernels_alone_are_checked_on_far_max():
    """check.kernel_inputs: kinds the kernels' shapes run on besides check.inputs, the peers' not (far_max,
    where plain fp16 code itself lands above the tolerance); the peers' checks read the same settings
    as before."""
    settings = validate(CONFIG, root=ROOT)
    assert settings.check_kernel_inputs == ["far_max"] and "far_max" not in settings.check_inputs
    assert settings.check_kinds("v25.causal") == [*settings.check_inputs, "far_max"]
    assert settings.check_kinds("sdpa_cudnn.causal") == settings.check_inputs
    assert settings.used_by("check", "v11")["inputs"][-1] == "far_max"
    assert settings.used_by("check", "unfused")["inputs"] == settings.check_inputs


def test_a_configuration_runs_the_head_to_head_as_it_asks_there(settings):
    """head_to_head.configurations: a configuration's points take its own S, rounds, rivals and energy
    rounds over head_to_head's; the others take head_to_head's own. Its points and the headline's cycle
    counts there follow its S."""
    from dataclasses import replace

    dense, d64 = settings.configurations[0], next(c for c in settings.configurations if c.name == "d64")
    assert "configurations" not in settings.head_to_head_in(dense)
    assert settings.head_to_head_in(dense)["energy_rounds"] == 1 and settings.head_to_head_in(d64)["energy_rounds"] == 0
    # the lead-in: 100 ms where a turn times back to back, 50 ms where every timing follows a graph
    assert (settings.head_to_head_in(dense)["lead_in_ms"], settings.head_to_head_in(d64)["lead_in_ms"]) == (100, 50)
    asked = replace(settings, head_to_head={**settings.head_to_head, "configurations": {
        "d64": {"S": [1024, 16384], "rounds": 6, "rivals": ["flash_attn_cute"]}}})
    d64_h2h = asked.head_to_head_in(d64)
    assert (d64_h2h["S"], d64_h2h["rounds"], d64_h2h["energy_rounds"]) == ([1024, 16384], 6, 1)
    assert [s.S for s in asked.headline_shapes(d64)] == [1024, 16384]
    assert [s.S for s in asked.headline_shapes(dense)] == [1024, *(S for S in settings.sweep["S"] if S != 1024)]
    assert asked.rivals_in(d64) == ["flash_attn_cute.d64"]
    assert [s.S for s in asked.cycle_shapes("v25.d64")] == [1024, 16384, 4000]
    assert {name for name, (_, c) in asked.head_to_head_points().items() if c == d64} == {"S1024.d64", "S16384.d64"}
    with pytest.raises(ConfigError, match=r"no point at S=2048 \(the case and config key 'head_to_head.configurations.d64.S'"):
        asked.head_to_head_shape(2048, d64)
    with pytest.raises(ConfigError, match=r"no point at S=3000 \(the case and config key 'sweep.S'"):
        asked.head_to_head_shape(3000, dense)


def test_the_headline_is_counted_at_the_ragged_lengths_where_cycles_ragged_asks(settings):
    """cycles.ragged: the headline versions at every point of the head-to-head and at sweep.ragged (the
    driver passes over a length a kernel does not take); a rival at the points alone; without the key,
    the points alone."""
    from dataclasses import replace

    points = [s.S for s in settings.headline_shapes(settings.configurations[0])]
    assert settings.cycles["ragged"] and settings.sweep["ragged"] == [4000]
    for name in ("v25", "v24"):
        assert [s.S for s in settings.cycle_shapes(name)] == [*points, 4000]
    # under the mask the points head_to_head.configurations names there: the case and S >= 1024, as in dense
    assert [s.S for s in settings.cycle_shapes("v25.causal")] == [*points, 4000]
    assert [s.S for s in settings.cycle_shapes("sdpa_cudnn")] == points
    unasked = replace(settings, cycles={"launches": 7})
    assert [s.S for s in unasked.cycle_shapes("v25")] == points


def test_a_ragged_pair_and_the_ragged_counts_rerun_only_what_reads_them(settings):
    """The sweep's digest holds the ragged pair's timing (a headline version's only), the cycles' digest
    the shapes and the launches: a rival more in the head-to-head reruns no sweep, a longer pair timing
    the headline's sweeps alone, cycles.ragged no count but the headline's."""
    from dataclasses import replace

    more_rivals = replace(settings, head_to_head={**settings.head_to_head, "level_within": 0.02,
                                                  "rivals": settings.head_to_head["rivals"][:1]})
    for name in ("v25", "v25.causal", "v24", "v11", "sdpa_cudnn"):
        assert settings.used_by("sweep", name) == more_rivals.used_by("sweep", name)
    assert settings.used_by("sweep", "v25")["paired"] == {"rounds": 6, "warmup": 10, "min_timing_ms": 1000,
                                                          "lead_in_ms": 100}
    assert "paired" not in settings.used_by("sweep", "sdpa_cudnn")
    longer = replace(settings, sweep={**settings.sweep, "ragged_pair": {**settings.sweep["ragged_pair"], "rounds": 12}})
    for name in ("v25", "v25.causal", "v24"):
        assert settings.used_by("sweep", name) != longer.used_by("sweep", name)
    for name in ("v11", "sdpa_cudnn", "sdpa_cudnn.causal"):
        assert settings.used_by("sweep", name) == longer.used_by("sweep", name)
    assert settings.used_by("head_to_head", "S4096") == longer.used_by("head_to_head", "S4096")
    unasked = replace(settings, cycles={"launches": settings.cycles["launches"]})
    for name in ("v11", "sdpa_cudnn", "sdpa_cudnn.causal"):
        assert settings.used_by("cycles", name) == unasked.used_by("cycles", name)
    assert settings.used_by("cycles", "v25") != unasked.used_by("cycles", "v25")


def test_an_archive_from_before_the_pairs_own_timing_paired_as_the_head_to_head_times(settings):
    """sweep.ragged_pair absent (an archive made before the key): the pair was timed with the
    head-to-head's rounds, warm-up, timing length and lead-in, and is read back so."""
    from dataclasses import replace

    from flashbench.config import PAIR_TIMING, pair_timing

    before = replace(settings, sweep={k: v for k, v in settings.sweep.items() if k != "ragged_pair"})
    h2h = settings.head_to_head
    assert before.ragged_pair_timing() == {k: h2h[k] for k in PAIR_TIMING}
    asked = {k: settings.sweep["ragged_pair"][k] for k in PAIR_TIMING}
    assert pair_timing(settings.sweep, h2h) == asked != before.ragged_pair_timing()


def test_a_configuration_left_out_of_the_ragged_pairs_sweeps_its_ragged_lengths_unpaired(settings):
    """sweep.ragged_pair.configurations: the headline pairs S=4000 there alone; elsewhere its sweep times
    S=4000 unpaired and reads no pair timing (a longer pair reruns none of its sweeps), its cycles still
    count S=4000; absent, every configuration pairs."""
    from dataclasses import replace

    pairing = settings.sweep["ragged_pair"]["configurations"]
    assert pairing == ["dense", "causal"]
    assert settings.pairs_ragged("v25") and settings.pairs_ragged("v25.causal")
    for name in ("v25.bf16", "v25.gqa", "v25.d64", "v25.d256"):
        assert not settings.pairs_ragged(name) and "paired" not in settings.used_by("sweep", name)
        assert 4000 in [s.S for s in settings.cycle_shapes(name)]
    everywhere = replace(settings, sweep={**settings.sweep, "ragged_pair": {
        k: v for k, v in settings.sweep["ragged_pair"].items() if k != "configurations"}})
    assert all(everywhere.pairs_ragged(f"v25.{c}") for c in ("bf16", "gqa", "d64", "d256"))
    assert everywhere.used_by("sweep", "v25") == settings.used_by("sweep", "v25")  # dense's sweep is not redone


def test_a_command_takes_the_config_file_itself_as_its_settings(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)  # where the commands run: the kernels' sources as config names them
    settings = load_settings(ROOT / "config.yaml")
    assert [k.name for k in settings.kernels] == [k.name for k in validate(CONFIG, root=ROOT).kernels]
    monkeypatch.chdir(tmp_path)  # elsewhere, the sources are not where a command would read them
    with pytest.raises(ConfigError, match=rf"'kernels.v11.source': no such file 'kernels/v11.cu' in {tmp_path} \(the "
                                          r"checkout's root, where the commands run\)$"):
        load_settings(ROOT / "config.yaml")


def test_a_key_given_twice_is_refused_but_a_merged_one_may_be_overridden(tmp_path):
    from flashbench import schemas

    assert schemas.parse_yaml("base: &b {x: 1, y: 2}\nc: {<<: *b, y: 3}\n") == {"base": {"x": 1, "y": 2},
                                                                              "c": {"x": 1, "y": 3}}
    with pytest.raises(yaml.YAMLError, match="key 'y' given twice"):
        schemas.parse_yaml("c: {y: 1, y: 3}\n")
