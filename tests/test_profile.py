"""The profile stage's parsers (ncu's CSV pages, nvdisasm's line table), on CPU with sample texts."""
import pytest

from flashbench import FlashbenchError
from flashbench import config
from flashbench.profile import (METRICS, STALL_METRIC, STALLS, chain_map, line_map, metrics_of, parse_raw,
                                parse_sass_samples, section_lines, softmax_lines, stall_lines)

from conftest import FAKE_CUPY, ROOT, recording_hold

KERNEL_SOURCES = sorted({k.source for k in config.load(ROOT / "config.yaml").kernels})

RAW = ('"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream",{names}\n'
       '"","","","","","","",{units}\n'
       '"0","42","python3","h","flash_attention_forward","1","7",{values}\n')


def raw_page(values: dict, units: dict) -> str:
    names = list(values)
    quote = lambda xs: ",".join(f'"{x}"' for x in xs)
    return RAW.format(names=quote(names), units=quote(units.get(n, "") for n in names),
                      values=quote(values[n] for n in names))


def test_raw_page_gives_every_metric_and_stall():
    values = {metric: "1,234.5" for metric in METRICS.values()}
    values |= {"gpu__time_duration.sum": "246,690", "launch__registers_per_thread": "126",
               "sm__inst_executed_pipe_lsu.avg.pct_of_peak_sustained_active": "49.77"}
    values |= {STALL_METRIC.format(s): "0.5" for s in STALLS} | {STALL_METRIC.format("barrier"): "3.51"}
    m = metrics_of(parse_raw(raw_page(values, {"gpu__time_duration.sum": "nsecond"})))
    assert m["duration_us"] == pytest.approx(246.69)
    assert m["registers"] == 126 and m["lsu_pipe_pct"] == 49.77 and m["smem_wavefronts"] == 1234.5
    assert m["stalls"]["barrier"] == 3.51 and set(m["stalls"]) == set(STALLS)


def test_a_raw_page_without_the_kernel_is_a_clear_error():
    with pytest.raises(FlashbenchError, match="no metrics row"):
        parse_raw("==PROF== Disconnected\n")


SASS_PAGE = '''"Kernel Name","flash_attention_forward",
"Address","Source","Warp Stall Sampling (All Samples)","Warp Stall Sampling (Not-issued Samples)","# Samples"
"0x7f90857a0000","      LDC R1, c[0x0][0x28]","22","19","22"
"0x7f90857a0010","      S2R R23, SR_TID.X","5","2","5"
"0x7f90857a0020","      LDS R4, [R2]","1,200","900","1,200"
'''


def test_sass_page_gives_samples_per_instruction_offset():
    assert parse_sass_samples(SASS_PAGE) == [(0x0, 22), (0x10, 5), (0x20, 1200)]


DISASSEMBLY = '''.text.flash_attention_forward:
\t//## File "/x/kernels/v11.cu", line 70
        /*0000*/                   LDC R1, c[0x0][0x28] ;
\t//## File "/x/kernels/flash_common.cuh", line 70 inlined at "/x/kernels/v11.cu", line 89
\t//## File "/x/kernels/v11.cu", line 89
        /*0010*/                   S2R R23, SR_TID.X ;
\t//## File "/usr/local/cuda/include/sm_20_intrinsics.hpp", line 151 inlined at "/x/kernels/flash_common.cuh", line 16
\t//## File "/x/kernels/flash_common.cuh", line 16 inlined at "/x/kernels/v11.cu", line 150
\t//## File "/x/kernels/v11.cu", line 150
        /*0020*/                   LDS R4, [R2] ;
'''


def test_inlined_instructions_count_for_the_kernel_line_that_called_them():
    # code whose outermost frame is another file belongs to no kernel line
    assert line_map(DISASSEMBLY, ROOT / "kernels" / "v11.cu") == {0x0: 70, 0x10: 89, 0x20: 150}


def test_an_instruction_inlined_twice_counts_for_every_line_on_its_chain():
    """A softmax inlined into a batch that is inlined into the loop (V25's peel): the instruction's line
    is the loop's call of the batch, its chain holds the batch's call of the softmax too, and the
    softmax's share counts it."""
    disassembly = (DISASSEMBLY + '\t//## File "/x/kernels/flash_common.cuh", line 108 inlined at "/x/kernels/v11.cu", line 291\n'
                   '\t//## File "/x/kernels/v11.cu", line 291 inlined at "/x/kernels/v11.cu", line 427\n'
                   '\t//## File "/x/kernels/v11.cu", line 427 inlined at "/x/kernels/v11.cu", line 439\n'
                   '\t//## File "/x/kernels/v11.cu", line 439\n'
                   '        /*0030*/                   MUFU.EX2 R24, R24 ;\n')
    source = ROOT / "kernels" / "v11.cu"
    assert line_map(disassembly, source)[0x30] == 439
    chains = chain_map(disassembly, source)
    assert chains[0x30] == {291, 427, 439} and chains[0x10] == {89} and chains[0x0] == {70}
    text = "\n".join(["x;"] * 426 + ["  if (!softmax_against_m()) {"] + ["y;"] * 20)  # line 427 calls the softmax
    samples = [(0x0, 10), (0x30, 30)]
    assert stall_lines(samples, line_map(disassembly, source), text)["softmax_share"] == 0  # its line alone: 439
    assert stall_lines(samples, line_map(disassembly, source), text, chains)["softmax_share"] == pytest.approx(0.75)


@pytest.mark.parametrize("source", ["v11.cu", "v12.cu", "v13.cu"])
def test_every_version_marks_its_softmax_section(source):
    text = (ROOT / "kernels" / source).read_text()
    lines = text.splitlines()
    softmax = section_lines(text)
    assert softmax, f"{source} has no `// ---- online softmax` section comment"
    assert any("fast_exp2" in lines[n - 1] for n in softmax)
    assert not any("mma_m16n8k16" in lines[n - 1] or "__syncthreads" in lines[n - 1] for n in softmax)


@pytest.mark.parametrize("source", KERNEL_SOURCES)
def test_every_kernel_shows_where_its_softmax_is(source):
    """Each configured kernel's softmax is found: its section, or (a softmax inlined at its calls, V16 on)
    the lines calling it, none of which issue a product or wait at a barrier. Without them its share of
    the stall samples would read 0."""
    text = (ROOT / source).read_text()
    lines, softmax = text.splitlines(), softmax_lines(text)
    assert softmax
    if not section_lines(text):
        assert all("softmax" in lines[n - 1].split("//")[0] for n in softmax)
    code = [lines[n - 1].split("//")[0] for n in softmax]
    assert not any(op in c for c in code for op in ("mma", "issue_", "named_bar", "__syncthreads"))


def test_a_source_without_a_softmax_has_no_softmax_share():
    text = "extern \"C\" __global__ void k() {\n  float x = 1.f;  // softmax() named in a comment only\n}\n"
    assert softmax_lines(text) == set()
    result = stall_lines([(0x0, 10)], {0x0: 2}, text)
    assert result["softmax_share"] is None and not result["top_lines"][0]["softmax"]


def test_stall_lines_rank_source_lines_and_measure_the_softmax():
    text = (ROOT / "kernels" / "v11.cu").read_text()
    softmax_line = min(section_lines(text))
    samples = [(0x0, 10), (0x10, 30), (0x20, 60), (0x30, 0)]
    offsets = {0x0: 70, 0x10: 89, 0x20: softmax_line}
    result = stall_lines(samples, offsets, text)
    assert result["stall_samples"] == 100 and result["softmax_share"] == pytest.approx(0.6)
    assert [line["line"] for line in result["top_lines"]] == [softmax_line, 89, 70]
    assert result["top_lines"][0]["softmax"] and not result["top_lines"][1]["softmax"]


def test_profile_runs_ncu_over_its_driver_and_reads_the_report_after(monkeypatch, tmp_path):
    """ncu runs launch-once with the driver's options (which hold the GPU for the profile); the report is
    read once it is done."""
    from flashbench import profile as profile_module

    steps = []
    monkeypatch.setattr(profile_module, "run", lambda cmd, what: steps.append((what, cmd)) or "")
    monkeypatch.setattr(profile_module, "raw_page", lambda ncu, report: steps.append(("ncu --page raw", None)) or "")
    monkeypatch.setattr(profile_module, "parse_raw", lambda raw: {})
    monkeypatch.setattr(profile_module, "parse_sass_samples", lambda page: {})
    monkeypatch.setattr(profile_module, "metrics_of", lambda raw: {})
    monkeypatch.setattr(profile_module, "version", lambda ncu: "v")
    monkeypatch.setattr(profile_module.shutil, "which", lambda name: None)  # no nvdisasm: the metrics alone
    driver = ["--hold-for", "profile v14", "--identity-out", str(tmp_path / "ran.json")]
    readings = profile_module.profile("ncu", tmp_path / "v14.cubin", tmp_path / "v14.json", tmp_path / "v14.cu",
                                      config.Shape(1, 64, 1024, 128), progress=lambda m: None, driver=driver)
    assert [what for what, _ in steps] == ["ncu", "ncu --page raw", "ncu --page source"]
    launched = steps[0][1]
    assert launched[launched.index("launch-once"):][-4:] == driver
    assert readings["lines_reason"].startswith("nvdisasm not found")


def test_launch_once_reads_no_settings_and_holds_the_gpu_for_the_profile(tmp_path, monkeypatch):
    """What ncu profiles: one launch of the kernel its build describes (no settings: the build says its
    configuration), the GPU held for the stage that runs it, and what ran said with the provenance."""
    import json
    import sys

    import records
    from flashbench import cli, gpu
    from flashbench.files import read_json, write_json

    steps = []

    class Kernel:
        identity = {"cubin_sha256": "a" * 64}

        def inputs(self, shape, rng, kind):
            steps.append(("inputs", kind))
            return ()

        def __call__(self):
            steps.append(("launch", None))

    def implementation(peer, cubin, record, run=None):
        steps.append(("load", run))
        return Kernel()

    monkeypatch.setattr(cli, "_gpu_held", recording_hold(steps))
    monkeypatch.setattr(cli, "_implementation", implementation)
    monkeypatch.setattr(gpu, "provenance", lambda: records.provenance("v14"))
    monkeypatch.setitem(sys.modules, "cupy", FAKE_CUPY)
    cubin, record, out = tmp_path / "v14.cubin", tmp_path / "v14.json", tmp_path / "ran.json"
    cubin.write_bytes(b"")
    write_json(record, records.compile_record("v14", "sm_90a", "kernels/v14.cu"))
    assert cli.main(["launch-once", "--cubin", str(cubin), "--record", str(record), "--shape",
                     json.dumps(records.CASE), "--hold-for", "profile v14", "--identity-out", str(out)]) == 0
    assert steps == [("hold", "profile v14"), ("load", None), ("inputs", "normal"), ("launch", None),
                     ("release", "profile v14")]
    assert read_json(out)["identity"] == Kernel.identity and read_json(out)["provenance"]["gpu"]
