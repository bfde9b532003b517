"""Load and validate config.yaml: the JSON schema first, then what a schema cannot say."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from . import FlashbenchError


class ConfigError(FlashbenchError):
    pass


@dataclass(frozen=True)
class Shape:
    B: int
    H: int
    S: int
    D: int

    def as_dict(self) -> dict:
        return {"B": self.B, "H": self.H, "S": self.S, "D": self.D}

    def __str__(self) -> str:
        return f"B={self.B} H={self.H} S={self.S} D={self.D}"


@dataclass(frozen=True)
class Kernel:
    name: str
    kind: str  # version | ablation
    source: str
    change: str
    published_tflops: float | None = None
    published_registers: int | None = None
    parent: str | None = None
    defines: dict = field(default_factory=dict)
    archs: list[str] | None = None  # None: the global archs (and the GPU's own)
    line: str = "g3"  # g3: the chapter's table; hopper: the sm_90a line after V13


@dataclass(frozen=True)
class Peer:
    name: str
    backend: str  # auto | cudnn | flash | efficient | unfused
    change: str
    published_tflops: float | None = None
    max_seq_len: int | None = None
    kind: str = "peer"

    def as_dict(self) -> dict:
        return {"name": self.name, "backend": self.backend, "change": self.change,
                "published_tflops": self.published_tflops, "max_seq_len": self.max_seq_len}


@dataclass(frozen=True)
class NextGoal:
    """The Hopper report's next goal, past FlashAttention-3 (config key 'goal.next')."""
    factors: dict[str, float]  # per rival's backend: the graph interval's low end and the cycle ratio both reach it
    min_s: int  # at the case and at every S from here
    efficiency_case: float  # the best version's efficiency per cycle at the case
    long_s: int
    efficiency_long: float  # and at every S from long_s


@dataclass(frozen=True)
class Goal:
    """The Hopper report's goal for the line's best version (config key 'goal')."""
    rivals: tuple[str, ...]  # the backends of the peers it is held to
    min_s: int  # at the case and at every S from here
    stretch: float  # the graph interval's low end against them, everywhere
    next: NextGoal


def sweep_steps(steps_at_case: int, case_s: int, S: int) -> int:
    """The write-up's method's calls per timing in the sweep at length S: as many as do the work of
    `steps_at_case` calls at the case's length (a call's work grows as S squared), to the nearest
    call (halves up), at least one; so above the length where one call does that work, a timing is
    one call and does more. At S=16384 one call does the work of 256 at S=1024: 20 of them would
    time 5 s where 1 times 14 ms."""
    return max(1, math.floor(steps_at_case * (case_s / S) ** 2 + 0.5))


@dataclass(frozen=True)
class Settings:
    gpu: str | None
    gpu_arch: str | None
    archs: list[str]
    nvcc_flags: list[str]
    kernels: list[Kernel]  # the kernels to run, in table order
    case: Shape
    check_shapes: list[Shape]  # the case first, then the extra shapes
    check_inputs: list[str]  # kinds of input every shape runs on
    check_smallest: tuple[int, int]  # B, H of each kernel's smallest-S shape
    check_factor: float  # times plain fp16's error
    tolerance: float  # cap on the whole-tensor relative error
    bench: dict
    goal: Goal
    peers: list[Peer] = field(default_factory=list)  # in table order, after the kernels
    baseline: str | None = None
    sweep: dict | None = None
    ncu: str | bool | None = None
    headline: list[str] = field(default_factory=list)  # the Hopper line's best versions, best first
    head_to_head: dict | None = None
    cycles: dict | None = None

    def sweep_shapes(self) -> list[Shape]:
        if not self.sweep:
            return []
        return [Shape(B=self.case.B, H=self.case.H, S=S, D=self.case.D) for S in self.sweep["S"]]

    def headline_shapes(self) -> list[Shape]:
        """Where the head-to-head runs and the headline's cycles are counted: the case, then every swept
        length other than the case's."""
        return list(dict.fromkeys([self.case, *self.sweep_shapes()]))

    def kernel(self, name: str) -> Kernel:
        for kernel in self.kernels:
            if kernel.name == name:
                return kernel
        raise ConfigError(f"no kernel named {name!r} is run (config key 'versions')")


def conform(value, pointer: str, what: str):
    """`value` if it is what the config schema says at `pointer` ("$defs/shape",
    "properties/nvcc_flags"), else a ConfigError naming `what` (if given), the key within `value`
    and the first problem."""
    from . import schemas

    schema = schemas.load("config")
    part = schema
    for name in pointer.split("/"):
        part = part[name]
    error = schemas.first_error(schemas.Validator({**part, "$defs": schema["$defs"]}), value)
    if error is not None:
        key, message = error
        where = " ".join(filter(None, [what, key if key != "(top level)" else ""]))
        raise ConfigError(f"{where}: {message}" if where else message)
    return value


def supported_archs() -> list[str]:
    from . import schemas

    return list(schemas.load("config")["$defs"]["arch"]["enum"])


def validate(config: dict, root: Path | str = ".") -> Settings:
    """Check a loaded config; raise ConfigError naming the first bad key, else return Settings."""
    # Imported here: the pipeline's commands import this module for Shape and Peer alone, and
    # jsonschema would be half of each one's start-up (sixteen compile jobs, for one).
    from . import schemas

    error = schemas.first_error(schemas.Validator(schemas.load("config")), config)
    if error:
        raise ConfigError(f"config key '{error[0]}': {error[1]}")

    definitions = config["kernels"]
    kernels = []
    for i, name in enumerate(config["versions"]):
        if name not in definitions:
            known = ", ".join(sorted(definitions))
            raise ConfigError(f"config key 'versions[{i}]': unknown version {name!r} (defined under kernels: {known})")
        spec = definitions[name]
        if "parent" in spec and spec["parent"] not in definitions:
            raise ConfigError(f"config key 'kernels.{name}.parent': unknown kernel {spec['parent']!r}")
        if spec["kind"] == "ablation" and "parent" not in spec:
            raise ConfigError(f"config key 'kernels.{name}.parent': an ablation must name the kernel it varies")
        if not (Path(root) / spec["source"]).is_file():
            raise ConfigError(f"config key 'kernels.{name}.source': no such file {spec['source']!r}")
        kernels.append(Kernel(name=name, **spec))

    peers = [Peer(name=name, **spec) for name, spec in config.get("peers", {}).items()]
    for peer in peers:
        if peer.name in definitions:
            raise ConfigError(f"config key 'peers.{peer.name}': a kernel has that name too")
    baseline = config.get("baseline")
    if baseline is not None and baseline not in {p.name for p in peers}:
        raise ConfigError(f"config key 'baseline': {baseline!r} is not one of the peers")

    headline = list(config.get("headline", []))
    for i, name in enumerate(headline):
        if name not in config["versions"]:
            raise ConfigError(f"config key 'headline[{i}]': {name!r} is not one of the versions run")
    head_to_head = config.get("head_to_head")
    if head_to_head:
        if not headline:
            raise ConfigError("config key 'head_to_head': needs the versions it compares (config key 'headline')")
        for i, name in enumerate(head_to_head["rivals"]):
            if name not in {p.name for p in peers}:
                raise ConfigError(f"config key 'head_to_head.rivals[{i}]': {name!r} is not one of the peers")

    ncu = config.get("ncu")
    if isinstance(ncu, str) and ncu.lower() in ("false", "true", "null", "none"):
        raise ConfigError(f"config key 'ncu': {ncu!r} is a string; write false in config.yaml, ncu=False on the "
                          f"command line")

    case = Shape(**config["case"])
    for peer in peers:
        if peer.max_seq_len is not None and peer.max_seq_len < case.S:
            raise ConfigError(f"config key 'peers.{peer.name}.max_seq_len': {peer.max_seq_len} is below the case's "
                              f"S={case.S}, where every peer is timed")
    extra = list(dict.fromkeys(Shape(**s) for s in config["check"]["shapes"] if Shape(**s) != case))
    smallest = config["check"]["smallest"]
    if smallest["B"] * smallest["H"] % 2 == 0:
        raise ConfigError(f"config key 'check.smallest': B*H = {smallest['B'] * smallest['H']} is even; the extra shape "
                          f"is there for an odd head count, which no power-of-two tiling of heads divides")
    if len(extra) < 3:
        raise ConfigError(f"config key 'check.shapes': needs at least 3 shapes other than the case, has {len(extra)}")
    return Settings(
        gpu=config.get("gpu"),
        gpu_arch=config.get("gpu_arch"),
        archs=list(config["archs"]),
        nvcc_flags=list(config.get("nvcc_flags", [])),
        kernels=kernels,
        case=case,
        check_shapes=[case] + extra,
        check_inputs=list(config["check"]["inputs"]),
        check_smallest=(config["check"]["smallest"]["B"], config["check"]["smallest"]["H"]),
        check_factor=float(config["check"]["factor"]),
        tolerance=float(config["check"]["tolerance"]),
        bench=dict(config["bench"]),
        goal=Goal(**{**config["goal"], "rivals": tuple(config["goal"]["rivals"]),
                     "next": NextGoal(**config["goal"]["next"])}),
        peers=peers,
        baseline=baseline,
        sweep=dict(config["sweep"]) if config.get("sweep") else None,
        ncu=config.get("ncu"),
        headline=headline,
        head_to_head=dict(head_to_head) if head_to_head else None,
        cycles=dict(config["cycles"]) if config.get("cycles") else None,
    )


def load(path: Path | str) -> Settings:
    path = Path(path)
    try:
        config = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as e:
        raise ConfigError(f"cannot read {path}: {e}") from None
    if not isinstance(config, dict):
        raise ConfigError(f"{path} must hold a mapping of config keys")
    return validate(config, root=path.parent)
