"""Records that belong together: one GPU, PCI bus id and driver per archive, and what is timed,
swept and profiled is the cubin that passed its check."""
import sys
import types

import pytest

from flashbench import FlashbenchError, gpu, schemas
from flashbench.cli import _same_as_checked, main

import records
from conftest import with_stub
from records import edit, gather

TFLOPS = {"v11": 140.0, "v12": 210.0, "v13": 220.0, "br128": 190.0, "hybrid_smem": 221.0}


@pytest.mark.parametrize("field, value", [("gpu", "NVIDIA H100 80GB HBM3"), ("pci_bus_id", "0000:2a:00.0"),
                                          ("driver", "575.0")])
def test_summarize_refuses_records_from_another_gpu_bus_or_driver(tmp_path, field, value):
    paths = records.write(tmp_path, TFLOPS)
    gather(paths)  # one GPU: fine
    edit(paths["benches"][2], lambda r: r["provenance"].update({field: value}))
    with pytest.raises(FlashbenchError, match="more than one GPU, PCI bus id or driver"):
        gather(paths)


UUID = "GPU-5fb2f8a4-9f4c-f1c7-3e2b-6a8c2b7a1e7b"


def test_summarize_carries_the_gpus_uuid_and_refuses_records_of_two(tmp_path):
    """Two GPUs of one kind on two machines can share the bus id and driver: their UUIDs tell them apart.
    A record made before the UUID was recorded has none, and is taken beside one that has."""
    paths = records.write(tmp_path, TFLOPS)
    for path in paths["checks"] + paths["benches"]:
        edit(path, lambda r: r["provenance"].update(gpu_uuid=UUID))
    assert {k["provenance"]["gpu_uuid"] for k in gather(paths)[3]["kernels"]} == {UUID}
    edit(paths["benches"][0], lambda r: r["provenance"].pop("gpu_uuid"))
    gather(paths)
    edit(paths["benches"][2], lambda r: r["provenance"].update(gpu_uuid=UUID.replace("5fb2", "77aa")))
    with pytest.raises(FlashbenchError, match=r"more than one GPU \(by its UUID\) \(GPU-5fb2.*: check/v11, "
                                              r".*; GPU-77aa.*: bench/v13\)"):
        gather(paths)


def test_provenance_names_the_gpu_by_its_nvml_uuid(monkeypatch):
    """The UUID of the GPU the kernels ran on: NVML's device at CUDA's PCI bus id, not the first one."""
    bus_ids = [b"00000000:0A:00.0", b"00000000:19:00.0"]
    pynvml = types.SimpleNamespace(
        nvmlInit=lambda: None, nvmlDeviceGetCount=lambda: len(bus_ids), nvmlDeviceGetHandleByIndex=lambda i: i,
        nvmlDeviceGetPciInfo=lambda i: types.SimpleNamespace(busId=bus_ids[i]),
        nvmlDeviceGetUUID=lambda i: [b"GPU-00000000-0000-0000-0000-000000000000", UUID.encode()][i])
    device = types.SimpleNamespace(pci_bus_id="0000:19:00.0", attributes={"MultiProcessorCount": 132,
                                                                           "L2CacheSize": 62914560})
    cupy = types.SimpleNamespace(__version__="14.2.0", cuda=types.SimpleNamespace(
        Device=lambda: device,
        runtime=types.SimpleNamespace(driverGetVersion=lambda: 13000, runtimeGetVersion=lambda: 13020)))
    monkeypatch.setitem(sys.modules, "pynvml", pynvml)
    monkeypatch.setitem(sys.modules, "cupy", cupy)
    monkeypatch.setattr(gpu, "_smi", lambda *query, device: ["NVIDIA H200", "9.0", "580.1", "1980", "700.00"])
    provenance = gpu.provenance()
    assert provenance["gpu"] == "NVIDIA H200" and provenance["gpu_uuid"] == UUID
    assert schemas.first_error(schemas.Validator({**schemas.load("records"), "$ref": "#/$defs/provenance"}),
                               provenance) is None


def test_summarize_refuses_a_timing_of_another_cubin_than_the_one_built(tmp_path):
    paths = records.write(tmp_path, TFLOPS)
    edit(paths["benches"][1], lambda r: r.update(cubin_sha256="f" * 64))
    with pytest.raises(FlashbenchError, match="bench/v12 names cubin ffffffffffff"):
        gather(paths)


def test_summarize_ties_a_hopper_kernel_to_its_sm_90a_build(tmp_path):
    kernels = records.KERNELS + records.HOPPER
    paths = records.write(tmp_path, {**TFLOPS, "v14": 430.0, "v15": 450.0}, kernels=kernels)

    gather(paths, kernels)
    v14_sweep = next(p for p in paths["sweeps"] if p.stem == "v14")
    edit(v14_sweep, lambda r: r.update(cubin_sha256="e" * 64))
    with pytest.raises(FlashbenchError, match="sweep/v14 names cubin eeeeeeeeeeee but v14's build for sm_90a is"):
        gather(paths, kernels)


def test_what_is_timed_must_be_what_passed_its_check():
    cubin = {"cubin_sha256": "a" * 64}
    _same_as_checked("v13", cubin, {"cubin_sha256": "a" * 64})
    with pytest.raises(FlashbenchError, match="v13 is not what passed its check: cubin_sha256 a+ \\(checked: b+\\)"):
        _same_as_checked("v13", cubin, {"cubin_sha256": "b" * 64})
    torch = {"torch": "2.12.0", "cudnn": "91900", "backend": "cudnn"}
    with pytest.raises(FlashbenchError, match="torch 2.12.0 \\(checked: 2.11.0\\)"):
        _same_as_checked("sdpa_cudnn", torch, {"torch": "2.11.0", "cudnn": "91900", "backend": "cudnn"})


def test_profile_refuses_a_cubin_other_than_the_checked_one(tmp_path, capsys, records_settings):
    paths = records.write(tmp_path, TFLOPS)
    check, record = paths["checks"][2], tmp_path / "build" / "sm_90" / "v13.json"
    edit(check, lambda r: r.update(cubin_sha256="c" * 64))
    out = tmp_path / "profile.json"
    cubin = record.with_suffix(".cubin")  # a build: never read, as ncu never runs
    cubin.write_bytes(b"")
    with_stub(tmp_path, "ncu", "exit 1")
    assert main(["profile", *records_settings, "--ncu", str(tmp_path / "ncu-stub" / "ncu"), "--cubin", str(cubin),
                 "--record", str(record), "--check", str(check), "--out", str(out)]) == 1
    assert "v13 is not what passed its check: cubin_sha256" in capsys.readouterr().err
    assert not out.exists()


def test_profile_records_what_its_driver_says_it_ran(tmp_path, monkeypatch, capsys, records_settings):
    """The profile stage holds no GPU: ncu runs launch-once, which holds it for `profile v13` and says what
    ran and on what GPU; a driver that could not hold the GPU fails the stage, and ncu's own failure,
    before the driver said anything, is recorded as not profiled."""
    import json

    from flashbench import profile as profile_module
    from flashbench.files import read_json, write_json

    from conftest import ROOT, the_parent_never_holds

    monkeypatch.chdir(ROOT)  # where the record's source is read
    paths = records.write(tmp_path, TFLOPS)
    check, record = paths["checks"][2], tmp_path / "build" / "sm_90" / "v13.json"
    cubin = record.with_suffix(".cubin")  # handed on to the driver, never read here
    cubin.write_bytes(b"")
    readings = {k: v for k, v in records.profile_record("v13", 124).items()
                if k in ("metrics", "ncu", "stall_samples", "softmax_share", "top_lines", "lines_reason")}
    said = {"identity": {"cubin_sha256": read_json(record)["cubin_sha256"]}, "provenance": records.provenance("v13")}
    drivers = []

    def fake_profile(ncu, cubin, record, source, shape, progress, driver):
        drivers.append(driver[driver.index("--hold-for") + 1])
        if said:
            write_json(driver[driver.index("--identity-out") + 1], said)
        if not said or "not_held" in said:
            raise FlashbenchError("ncu failed: ==ERROR== The application returned an error code (1).")
        return readings

    monkeypatch.setattr(profile_module, "profile", fake_profile)
    monkeypatch.setattr("flashbench.cli._gpu_held", the_parent_never_holds)
    with_stub(tmp_path, "ncu", "exit 1")  # never run: profile is faked
    out = tmp_path / "profile.json"
    argv = ["profile", *records_settings, "--ncu", str(tmp_path / "ncu-stub" / "ncu"), "--cubin", str(cubin),
            "--record", str(record), "--check", str(check), "--out", str(out)]
    assert main(argv) == 0, capsys.readouterr().err
    made = json.loads(out.read_text())
    assert made["profiled"] and made["provenance"] == said["provenance"] and drivers == ["profile v13"]
    out.unlink()
    said.clear()  # ncu failed before its driver said anything: recorded, the run goes on
    assert main(argv) == 0 and not json.loads(out.read_text())["profiled"]
    out.unlink()
    said["not_held"] = "cannot open the GPU lock /nowhere/flashbench-gpu.lock"  # the stage fails
    assert main(argv) == 1 and not out.exists()
