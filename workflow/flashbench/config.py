"""Load and validate config.yaml: the JSON schema first, then what a schema cannot say."""
from __future__ import annotations

import hashlib
import json
import math
from dataclasses import asdict, dataclass, field, replace
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
class Configuration:
    """What a kernel or peer computes (config key 'configurations'): the mask, the head dim, the
    element type, and how many query heads read each K/V head (grouped K/V heads: GQA, MQA)."""
    name: str
    mask: str  # none | causal
    D: int
    dtype: str  # fp16 | bf16
    kv_group: int = 1  # query heads per K/V head, as far as a shape's H allows (kv_heads)

    @property
    def causal(self) -> bool:
        return self.mask == "causal"

    @property
    def defines(self) -> dict:
        """Its compile-time parameters, beside the kernel's own: the mask, the element type, whether K and
        V are of grouped heads (the group itself is a launch's parameter), and a head dim other than 128."""
        return {**({"FLASH_CAUSAL": 1} if self.causal else {}), **({"FLASH_BF16": 1} if self.dtype == "bf16" else {}),
                **({"FLASH_GROUPED_KV": 1} if self.kv_group > 1 else {}),
                **({"FLASH_HEAD_DIM": self.D} if self.D != 128 else {})}

    def shape(self, shape: Shape) -> Shape:
        """`shape` as this configuration runs it: at its head dim."""
        return replace(shape, D=self.D)

    def kv_heads(self, H: int) -> int:
        """K/V heads at H query heads: H / kv_group, at least one (so H=3 under a group of 8 is MQA, its 3
        query heads on one K/V head). validate holds every configured H to a whole number of query heads
        per K/V head."""
        return max(1, H // self.kv_group)

    def as_dict(self) -> dict:
        return {"name": self.name, "mask": self.mask, "D": self.D, "dtype": self.dtype,
                **({"kv_group": self.kv_group} if self.kv_group > 1 else {})}


# What a config without `configurations` runs in: no mask, D=128, fp16.
DENSE = Configuration("dense", "none", 128, "fp16")
RUN_SEPARATOR = "."  # a run in another configuration than the first: <kernel or peer>.<configuration>


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
    configurations: tuple[str, ...] = ()  # the configurations it runs in (validate fills in the first)

    def runs_in(self, configuration: Configuration) -> bool:
        return configuration.name in self.configurations


@dataclass(frozen=True)
class Run:
    """A kernel or peer in one configuration: named by the kernel or peer in the first configuration,
    `<name>.<configuration>` in another, so that the first's files keep their names."""
    name: str
    of: str  # the kernel or peer
    configuration: Configuration


@dataclass(frozen=True)
class Peer:
    name: str
    backend: str  # auto | cudnn | flash | efficient | unfused
    change: str
    published_tflops: float | None = None
    max_seq_len: int | None = None
    kind: str = "peer"
    configurations: tuple[str, ...] | None = None  # the configurations it runs in (None: every one)

    def runs_in(self, configuration: Configuration) -> bool:
        return self.configurations is None or configuration.name in self.configurations

    def as_dict(self) -> dict:
        return {"name": self.name, "backend": self.backend, "change": self.change,
                "published_tflops": self.published_tflops, "max_seq_len": self.max_seq_len}


@dataclass(frozen=True)
class NextGoal:
    """The Hopper report's next goal, past FlashAttention-3 (config key 'goal.next')."""
    factors: dict[str, float]  # per rival's backend: the graph interval's low end and the cycle ratio both reach it
    min_s: int  # at the case and at every S from here
    efficiency_case: float | None  # the best version's efficiency per cycle at the case (None: not asked)
    long_s: int
    efficiency_long: float | None  # and at every S from long_s (None: not asked)
    configurations: dict = field(default_factory=dict)  # a configuration's name -> what it asks instead
    # {configuration, within}: the best version's cycles at the case and at every S from min_s at most
    # (1 + within) times the cycles of that configuration's best version there (a configuration's only)
    cycles_of: dict | None = None


@dataclass(frozen=True)
class Goal:
    """The Hopper report's goal for the line's best version (config key 'goal')."""
    rivals: tuple[str, ...]  # the backends of the peers it is held to
    min_s: int  # at the case and at every S from here
    stretch: float  # the graph interval's low end against them, everywhere
    next: NextGoal
    ragged_within: float | None = None  # at a ragged S, how far below the next multiple of 128's TFLOPS

    def in_configuration(self, name: str | None) -> Goal:
        """The goal a configuration's part of the report is judged against: the next goal with what
        config's `goal.next.configurations` asks there instead."""
        return replace(self, next=replace(self.next, **self.next.configurations.get(name, {}), configurations={}))


def sweep_lengths(sweep: dict | None) -> list[int]:
    """A sweep's lengths (config key 'sweep'): its S, then its ragged ones (timed by what takes any S)."""
    return [*sweep["S"], *sweep.get("ragged", [])] if sweep else []


PAIR_TIMING = ("rounds", "warmup", "min_timing_ms", "lead_in_ms")  # how a ragged pair is timed


def pair_timing(sweep: dict | None, head_to_head: dict) -> dict:
    """How a headline version's sweep times its ragged lengths against the next multiple of 128
    (PAIR_TIMING): config's sweep.ragged_pair, or where it is absent (an archive from before the key)
    as the head-to-head times."""
    timing = (sweep or {}).get("ragged_pair") or head_to_head
    return {k: timing[k] for k in PAIR_TIMING}


def pairs_in(sweep: dict | None, configuration: str) -> bool:
    """Whether the headline versions' sweeps in the configuration named pair their ragged lengths
    (sweep.ragged_pair.configurations; absent: in every configuration)."""
    asked = ((sweep or {}).get("ragged_pair") or {}).get("configurations")
    return asked is None or configuration in asked


def _as_list(shapes) -> list:
    """check.ragged as a list: one shape alone is a run's from before the list."""
    return [shapes] if isinstance(shapes, dict) else list(shapes)


def ragged_near(S: int, tile: int = 128) -> int:
    """The length a ragged S (sweep.ragged) is paired with: the next multiple of the tile."""
    return -(-S // tile) * tile


def ragged_pairable(ragged: list[int], timed: set[int]) -> list[int]:
    """The ragged lengths a sweep that timed the lengths `timed` pairs: those timed with their near one."""
    return [S for S in ragged if {S, ragged_near(S)} <= timed]


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
    configurations: list[Configuration] = field(default_factory=lambda: [DENSE])  # the case's first
    check_ragged: tuple[Shape, ...] = ()  # shapes of a ragged S, checked by whatever takes any S
    check_kernel_inputs: list[str] = field(default_factory=list)  # kinds the kernels alone run on, besides
    mapping: dict = field(default_factory=dict, repr=False, compare=False)  # the validated config it was made of

    def used_by(self, stage: str, name: str | None = None):
        """What of the settings `stage`'s command reads (for `name`, a kernel or peer, where the stage runs
        one): its rule's params carry a digest of it, so that Snakemake reruns a job when what it read
        changes, and only then. The summary reads them all."""
        run = self.run(name) if name and stage != "head_to_head" else None  # a build or a peer's run
        of = run.of if run else name
        peer = {"peer": self.peer(of).as_dict()} if self.is_peer(of) else {}
        configuration = run.configuration if run else self.point_configuration(name) if name else None
        if configuration and configuration != self.configurations[0]:  # the first's jobs read what they read before
            peer["configuration"] = configuration.as_dict()
        shaped = self.in_configuration(configuration) if configuration else self  # its shapes at its head dim
        case = shaped.case.as_dict()
        # the pair's timing is read by the runs that pair alone: a change to it reruns no other sweep
        sweep = {k: v for k, v in self.sweep.items() if k != "ragged_pair"} if self.sweep else None
        if stage == "compile":
            return {"nvcc_flags": self.nvcc_flags, "source": self.kernel(of).source, "defines": self.defines(name)}
        if stage == "check":
            return {**peer, "shapes": [s.as_dict() for s in shaped.check_shapes], "inputs": self.check_kinds(name),
                    "smallest": self.check_smallest, "factor": self.check_factor, "tolerance": self.tolerance,
                    **({"ragged": [s.as_dict() for s in shaped.check_ragged]} if self.check_ragged else {})}
        if stage == "bench":
            return {**peer, "case": case, "bench": self.bench}
        if stage == "sweep":  # a headline version's pairs its ragged lengths as sweep.ragged_pair times them
            paired = {"paired": self.ragged_pair_timing()} if name and self.pairs_ragged(name) else {}
            return {**peer, "case": case, "sweep": sweep, **paired}
        if stage == "profile":
            return {"case": case}
        if stage == "head_to_head":
            contestants = self.contestants(configuration or self.configurations[0])
            return {**peer, "case": case, "sweep": sweep, "contestants": contestants,
                    "peers": [self.peer(self.run(n).of).as_dict() for n in contestants if self.run(n).of not in self.headline],
                    "head_to_head": self.head_to_head_in(configuration or self.configurations[0])}
        if stage == "cycles":  # where (cycles.ragged among what decides it) and how many launches
            return {**peer, "shapes": [s.as_dict() for s in shaped.cycle_shapes(name)],
                    "launches": self.cycles["launches"]}
        if stage == "summarize":
            return self.mapping
        if stage == "render":
            return asdict(self.goal)
        raise ConfigError(f"no stage {stage!r} reads the settings")

    def entries(self) -> list[dict]:
        """What each run is, in table order (runs), as kernels.json lists them: the run's name, the
        kernel or peer it is of and its configuration, then what the kernel or peer is."""
        fields = ("kind", "source", "change", "published_tflops", "published_registers", "parent", "archs", "line")
        entries = []
        for run in self.runs():
            about = {"name": run.name, "of": run.of, "config": run.configuration.name,
                     "causal": run.configuration.causal}
            if self.is_peer(run.of):
                entries.append({**self.peer(run.of).as_dict(), **about, "kind": "peer"})
            else:
                kernel = self.kernel(run.of)
                entries.append({**about, **{f: getattr(kernel, f) for f in fields}, "defines": self.defines(run.name)})
        return entries

    def profiling_notes(self, ncu_found: bool) -> tuple[str | None, str | None]:
        """Why the profile and the cycle counts are not in the run (None where they are): not asked for
        (config `ncu: false`, no `cycles`), or no Nsight Compute found (config `ncu`, else ncu on PATH)."""
        if self.ncu is False:
            profile = "not asked for (config ncu: false)"
        elif not ncu_found:
            profile = f"skipped: {self.ncu or 'ncu'} was not found on this machine"
        else:
            profile = None
        cycles = profile or (None if self.cycles else "not asked for (no cycles in config.yaml)")
        return profile, cycles

    def in_configuration(self, configuration: Configuration) -> Settings:
        """These settings as a run in `configuration` reads its shapes: the case, the check's shapes and
        its ragged ones at the configuration's head dim (the case's B, H and S in every configuration)."""
        c = configuration
        return replace(self, case=c.shape(self.case), check_shapes=[c.shape(s) for s in self.check_shapes],
                       check_ragged=tuple(c.shape(s) for s in self.check_ragged))

    def sweep_shapes(self) -> list[Shape]:
        """The case at each of the sweep's lengths (sweep_lengths)."""
        return [replace(self.case, S=S) for S in sweep_lengths(self.sweep)]

    def headline_shapes(self, configuration: Configuration | None = None) -> list[Shape]:
        """Where the head-to-head runs and the headline's cycles are counted: the case, then every length
        of sweep.S other than the case's; in `configuration`, those of its head_to_head.configurations.S
        alone where it names them (validate holds them to sweep.S, the case's S among them)."""
        lengths = self.sweep["S"] if self.sweep else []
        asked = self.head_to_head_in(configuration).get("S") if configuration else None
        shapes = [self.case, *(replace(self.case, S=S) for S in lengths)]
        return list(dict.fromkeys(s for s in shapes if asked is None or s.S in asked))

    def head_to_head_in(self, configuration: Configuration) -> dict:
        """config's head_to_head as a point in `configuration` runs it (head_to_head_in, below)."""
        return head_to_head_in(self.head_to_head or {}, configuration.name)

    def kernel(self, name: str) -> Kernel:
        for kernel in self.kernels:
            if kernel.name == name:
                return kernel
        raise ConfigError(f"no kernel named {name!r} is run (config key 'versions')")

    def configuration(self, name: str) -> Configuration:
        for configuration in self.configurations:
            if configuration.name == name:
                return configuration
        raise ConfigError(f"no configuration named {name!r} (config key 'configurations')")

    def kernel_builds(self) -> list[Run]:
        """Each kernel in each configuration it runs in: what the compile stage builds, in table order."""
        return [self.run_of(k.name, c) for k in self.kernels for c in self.configurations if k.runs_in(c)]

    def peer_runs(self) -> list[Run]:
        """Each peer in each configuration it runs in (every one, unless it names them), in table order."""
        return [self.run_of(p.name, c) for p in self.peers for c in self.configurations if p.runs_in(c)]

    def is_peer(self, name: str) -> bool:
        """Whether `name` is one of the peers' (not a kernel's, nor a run's)."""
        return any(p.name == name for p in self.peers)

    def check_kinds(self, name: str) -> list[str]:
        """The kinds of input the run `name` is checked on: a kernel's also check.kernel_inputs."""
        return self.check_inputs + ([] if self.is_peer(self.run(name).of) else self.check_kernel_inputs)

    def runs(self) -> list[Run]:
        """Every run, in table order: each configuration's kernels, then its peers."""
        return [run for c in self.configurations for run in
                [self.run_of(x.name, c) for x in [*self.kernels, *self.peers] if x.runs_in(c)]]

    def run_of(self, name: str, configuration: Configuration) -> Run:
        suffix = "" if configuration == self.configurations[0] else RUN_SEPARATOR + configuration.name
        return Run(name + suffix, name, configuration)

    def _named(self, name: str) -> tuple[str, Configuration]:
        """What a run's or a point's name (v25.causal, S1024.causal) is of, and its configuration."""
        of, _, configuration = name.partition(RUN_SEPARATOR)
        return of, self.configuration(configuration) if configuration else self.configurations[0]

    def run(self, name: str) -> Run:
        """The kernel or peer and configuration of a run's name (v25, v25.causal)."""
        of, configuration = self._named(name)
        found = next(((x, key) for xs, key in ((self.kernels, "kernels"), (self.peers, "peers")) for x in xs
                      if x.name == of), None)
        if found is None:
            raise ConfigError(f"no kernel or peer named {of!r} is run (config keys 'versions', 'peers')")
        what, key = found
        if not what.runs_in(configuration):
            raise ConfigError(f"{of} does not run in the configuration {configuration.name!r} "
                              f"(config key '{key}.{of}.configurations')")
        return self.run_of(of, configuration)

    def defines(self, build: str) -> dict:
        """A kernel build's -D parameters: the kernel's own, then its configuration's."""
        run = self.run(build)
        return {**self.kernel(run.of).defines, **run.configuration.defines}

    def peer(self, name: str) -> Peer:
        for peer in self.peers:
            if peer.name == name:
                return peer
        raise ConfigError(f"no peer named {name!r} (config key 'peers')")

    def headline_in(self, configuration: Configuration) -> list[str]:
        """The runs of the headline versions that run in `configuration` (v25.causal), best first."""
        return [self.run_of(name, configuration).name for name in self.headline
                if self.kernel(name).runs_in(configuration)]

    def rivals_in(self, configuration: Configuration) -> list[str]:
        """The runs of the head-to-head's rivals in `configuration`: none where no headline version runs
        there (it has no head-to-head)."""
        if not self.head_to_head or not self.headline_in(configuration):
            return []
        return [self.run_of(name, configuration).name for name in self.head_to_head_in(configuration)["rivals"]
                if self.peer(name).runs_in(configuration)]

    def contestants(self, configuration: Configuration) -> list[str]:
        """The head-to-head's contestants in `configuration`, by their runs' names: the headline versions
        that run there, then the rivals."""
        return self.headline_in(configuration) + self.rivals_in(configuration)

    def head_to_head_points(self) -> dict[str, tuple[Shape, Configuration]]:
        """The head-to-head's points by name: each of headline_shapes in each configuration the headline
        runs in with rivals there, S1024 in the first configuration and S1024.causal in another (a run's
        naming)."""
        points = {}
        for configuration in self.configurations:
            if self.rivals_in(configuration):
                for shape in self.headline_shapes(configuration):
                    points[self.run_of(f"S{shape.S}", configuration).name] = (shape, configuration)
        return points

    def point_configuration(self, name: str) -> Configuration:
        """The configuration of a head-to-head point's name (S1024.causal: causal)."""
        return self._named(name)[1]

    def head_to_head_shape(self, S: int, configuration: Configuration | None = None) -> Shape:
        """The head-to-head's point at length S (one of headline_shapes, in `configuration`)."""
        for shape in self.headline_shapes(configuration):
            if shape.S == S:
                return shape
        asked = f"config key 'head_to_head.configurations.{configuration.name}.S'" if configuration and \
            "S" in self.head_to_head_in(configuration) else "config key 'sweep.S'"
        raise ConfigError(f"the head-to-head has no point at S={S} (the case and {asked})")

    def pairs_ragged(self, name: str) -> bool:
        """Whether the run `name`'s sweep pairs its ragged lengths with the next multiple of 128: a
        headline version's, where a head-to-head is configured, in a configuration that pairs (pairs_in;
        headtohead.measure_ragged)."""
        run = self.run(name)
        return bool(self.head_to_head and (self.sweep or {}).get("ragged") and run.of in (self.headline or [])
                    and pairs_in(self.sweep, run.configuration.name))

    def ragged_pair_timing(self) -> dict:
        """How a paired ragged length is timed (pair_timing); its interval is the head-to-head's."""
        return pair_timing(self.sweep, self.head_to_head)

    def cycle_shapes(self, name: str) -> list[Shape]:
        """Where the run `name` is counted: a contestant at every point of the head-to-head, a headline
        version at the sweep's ragged lengths too where cycles.ragged asks (its driver passes over a
        length the kernel does not take: V24's whole tiles), the rest at the case."""
        run = self.run(name)
        if name not in self.contestants(run.configuration):
            return [self.case]
        asked = (self.cycles or {}).get("ragged") and run.of in (self.headline or [])
        ragged = (self.sweep or {}).get("ragged", []) if asked else []
        return [*self.headline_shapes(run.configuration), *(replace(self.case, S=S) for S in ragged)]


METHODS = ("step", "graph")  # the head-to-head's: the write-up's back-to-back calls; their CUDA graph


def methods(head_to_head: dict) -> tuple[str, ...]:
    """What a point times with `head_to_head` (config's, in its configuration: head_to_head_in): by CUDA
    graph always, the fair figure every goal judges; back to back too unless back_to_back is false.
    Where a call takes a millisecond or more the two agree within noise; only calls whose Python
    dispatch outlasts their kernel tell them apart, and those are no fair figure."""
    return METHODS if head_to_head.get("back_to_back", True) else ("graph",)


def head_to_head_in(head_to_head: dict, configuration: str) -> dict:
    """config's head_to_head (or an archive's) as a point in the configuration named runs it: the settings
    with what head_to_head.configurations asks there instead (its rivals, S, rounds, energy_rounds)."""
    own = {k: v for k, v in head_to_head.items() if k != "configurations"}
    return {**own, **head_to_head.get("configurations", {}).get(configuration, {})}


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


def _runs_in(key: str, what: str, named: list[str], known: list[str]) -> tuple[str, ...]:
    """The configurations a kernel's or peer's `configurations` (config key `key`) name: known ones,
    the first (the case's, where its tables, timings and reports are) among them."""
    for j, configuration in enumerate(named):
        if configuration not in known:
            raise ConfigError(f"config key '{key}.configurations[{j}]': unknown configuration {configuration!r} "
                              f"(defined under configurations: {', '.join(known)})")
    if known[0] not in named:
        raise ConfigError(f"config key '{key}.configurations': every {what} runs in the first configuration, "
                          f"{known[0]!r}, the case's")
    return tuple(named)


def validate(config: dict, root: Path | str = ".", *, schema_checked: bool = False, check_sources: bool = True) -> Settings:
    """Check a loaded config; raise ConfigError naming the first bad key, else return Settings.
    `schema_checked`: the config is a settings file the workflow wrote once it had checked it (see
    load_settings), so the JSON schema is not applied again. `check_sources`: whether each kernel's
    source must be a file under `root` (not for the settings an archive embeds, read anywhere)."""
    if not schema_checked:
        # Imported here: jsonschema would be most of a command's start-up, and the commands read a
        # settings file that was checked already (load_settings).
        from . import schemas

        error = schemas.first_error(schemas.Validator(schemas.load("config")), config)
        if error:
            raise ConfigError(f"config key '{error[0]}': {error[1]}")

    configurations = [Configuration(name=name, **spec) for name, spec in config.get("configurations", {}).items()] \
        or [DENSE]
    known_configurations = [c.name for c in configurations]
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
        if check_sources and not (Path(root) / spec["source"]).is_file():
            raise ConfigError(f"config key 'kernels.{name}.source': no such file {spec['source']!r} in "
                              f"{Path(root).resolve()} (the checkout's root, where the commands run)")
        runs_in = _runs_in(f"kernels.{name}", "kernel", spec.get("configurations", known_configurations[:1]),
                           known_configurations)
        kernels.append(Kernel(name=name, **{**spec, "configurations": runs_in}))

    peers = [Peer(name=name, **{**spec, **({"configurations": _runs_in(f"peers.{name}", "peer", spec["configurations"],
                                                                       known_configurations)}
                                          if "configurations" in spec else {})})
             for name, spec in config.get("peers", {}).items()]
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
        peer_named = {p.name: p for p in peers}
        for i, name in enumerate(head_to_head["rivals"]):
            if name not in peer_named:
                raise ConfigError(f"config key 'head_to_head.rivals[{i}]': {name!r} is not one of the peers")
        for configuration, asked in head_to_head.get("configurations", {}).items():
            key = f"head_to_head.configurations.{configuration}"
            if configuration not in known_configurations:
                raise ConfigError(f"config key '{key}': unknown configuration {configuration!r} "
                                  f"(defined under configurations: {', '.join(known_configurations)})")
            here = configurations[known_configurations.index(configuration)]
            for i, name in enumerate(asked.get("rivals", [])):
                peer = peer_named.get(name)
                if peer is None:
                    raise ConfigError(f"config key '{key}.rivals[{i}]': {name!r} is not one of the peers")
                if not peer.runs_in(here):
                    raise ConfigError(f"config key '{key}.rivals[{i}]': {name!r} does not run in {configuration!r} "
                                      f"(its configurations: {', '.join(peer.configurations)})")
            if "rivals" in asked and not asked["rivals"]:
                racing = [k.name for k in kernels if k.name in headline and k.runs_in(here)]
                if len(racing) > 1:
                    raise ConfigError(f"config key '{key}.rivals': none, so no head-to-head in {configuration!r}, "
                                      f"where the headline versions {', '.join(racing)} run: they would go "
                                      f"uncompared")
            lengths = (config.get("sweep") or {}).get("S")  # without a sweep, the case is the only point
            for i, S in enumerate(asked.get("S", []) if lengths else []):
                if S not in lengths:
                    raise ConfigError(f"config key '{key}.S[{i}]': {S} is not one of sweep.S {lengths}")
            if "S" in asked and config["case"]["S"] not in asked["S"]:
                raise ConfigError(f"config key '{key}.S': leaves out the case's S={config['case']['S']}")

    for c in known_configurations:  # what a configuration's part of hopper.md judges its best version by
        asked = {**config["goal"]["next"], **config["goal"]["next"].get("configurations", {}).get(c, {})}
        if not (asked["factors"] or asked.get("cycles_of") or asked["efficiency_case"] is not None
                or asked["efficiency_long"] is not None):
            raise ConfigError(f"config key 'goal.next.configurations.{c}': asks nothing (no factor, efficiency or "
                              f"cycles_of): its next goal would be reached with nothing judged")
    for name, asked in config["goal"]["next"].get("configurations", {}).items():
        if name not in known_configurations:
            raise ConfigError(f"config key 'goal.next.configurations.{name}': unknown configuration {name!r} "
                              f"(defined under configurations: {', '.join(known_configurations)})")
        against = (asked.get("cycles_of") or {}).get("configuration")
        if against is not None and (against not in known_configurations or against == name):
            raise ConfigError(f"config key 'goal.next.configurations.{name}.cycles_of.configuration': {against!r} is "
                              f"not another configuration (defined under configurations: "
                              f"{', '.join(known_configurations)})")
        chain = [name]
        while against is not None and against not in chain:  # each held to another's cycles, ending at one that is not
            chain.append(against)
            against = (config["goal"]["next"]["configurations"].get(against, {}).get("cycles_of") or {}).get("configuration")
        if against is not None:
            raise ConfigError(f"config key 'goal.next.configurations.{name}.cycles_of': the configurations are held to "
                              f"each other's cycles in a loop ({' -> '.join(chain + [against])}), so none is judged "
                              f"by anything measured")

    ncu = config.get("ncu")
    if isinstance(ncu, str) and ncu.lower() in ("false", "true", "null", "none"):
        raise ConfigError(f"config key 'ncu': {ncu!r} is a string; write false in config.yaml, ncu=False on the "
                          f"command line")

    case = Shape(**config["case"])
    if case.D != configurations[0].D:
        raise ConfigError(f"config key 'case.D': {case.D}, but the first configuration "
                          f"({configurations[0].name}) has D={configurations[0].D}")
    for peer in peers:
        if peer.max_seq_len is not None and peer.max_seq_len < case.S:
            raise ConfigError(f"config key 'peers.{peer.name}.max_seq_len': {peer.max_seq_len} is below the case's "
                              f"S={case.S}, where every peer is timed")
    extra = list(dict.fromkeys(Shape(**s) for s in config["check"]["shapes"] if Shape(**s) != case))
    smallest = config["check"]["smallest"]
    if smallest["B"] * smallest["H"] % 2 == 0:
        raise ConfigError(f"config key 'check.smallest': B*H = {smallest['B'] * smallest['H']} is even; the extra shape "
                          f"is there for an odd head count, which no power-of-two tiling of heads divides")
    sweep = config.get("sweep") or {}
    for i, name in enumerate((sweep.get("ragged_pair") or {}).get("configurations", [])):
        if name not in known_configurations:
            raise ConfigError(f"config key 'sweep.ragged_pair.configurations[{i}]': unknown configuration {name!r} "
                              f"(defined under configurations: {', '.join(known_configurations)})")
    for i, S in enumerate(sweep.get("ragged", [])):
        if ragged_near(S) not in sweep["S"]:
            raise ConfigError(f"config key 'sweep.ragged[{i}]': {S} is held against the next multiple of 128, "
                              f"{ragged_near(S)}, which is not one of sweep.S")
    if len(extra) < 3:
        raise ConfigError(f"config key 'check.shapes': needs at least 3 shapes other than the case, has {len(extra)}")
    head_counts = {"case.H": case.H, "check.smallest.H": smallest["H"],
                   **{f"check.shapes[{i}].H": s["H"] for i, s in enumerate(config["check"]["shapes"])},
                   **{f"check.ragged[{i}].H": s["H"] for i, s in enumerate(_as_list(config["check"].get("ragged", [])))}}
    for configuration in configurations:
        for key, H in head_counts.items():
            if H % configuration.kv_heads(H):
                raise ConfigError(f"config key '{key}': {H} query heads do not share the {configuration.kv_heads(H)} K/V "
                                  f"heads of configuration {configuration.name} (kv_group {configuration.kv_group}) "
                                  f"evenly")
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
        check_ragged=tuple(Shape(**s) for s in _as_list(config["check"].get("ragged", []))),
        check_kernel_inputs=[k for k in config["check"].get("kernel_inputs", []) if k not in config["check"]["inputs"]],
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
        configurations=configurations,
        mapping=config,
    )


def read(path: Path | str) -> dict:
    """The config mapping in a YAML file, not yet validated."""
    from . import schemas

    path = Path(path)
    try:
        config = schemas.parse_yaml(path.read_text())
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        raise ConfigError(f"{path}{f' line {mark.line + 1}' if mark else ''}: {e.problem or e.context}") from None
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as e:
        raise ConfigError(f"cannot read {path}: {e}") from None
    if not isinstance(config, dict):
        raise ConfigError(f"{path} must hold a mapping of config keys")
    return config


def load(path: Path | str) -> Settings:
    """The validated settings of a config file; kernel sources are found beside it (config.yaml sits
    beside kernels/)."""
    return validate(read(path), root=Path(path).parent)


def digest(value) -> str:
    """A short hash of a JSON-able value: what a rule's params carry of the settings it depends on, so
    that Snakemake reruns it when they change (and only then). Order counts: the order of config's
    kernels and peers is the order of the tables."""
    return hashlib.sha256(json.dumps(value).encode()).hexdigest()[:16]


def load_settings(path: Path | str) -> Settings:
    """The settings of a run from the file write_settings made of its validated config, or from a config
    file (.yaml) itself. A settings file's name is its content's digest: one edited since (or not written by
    the workflow) is refused rather than trusted without the schema."""
    from .files import read_json

    path = Path(path)
    if path.suffix in (".yaml", ".yml"):  # a config file itself (its kernels' sources in the checkout run in)
        return validate(read(path), ".")
    try:
        config = read_json(path)
    except FlashbenchError as e:
        raise ConfigError(str(e)) from None
    if not isinstance(config, dict) or path.stem != digest(config):
        raise ConfigError(f"{path} is not a settings file the workflow wrote (its name is not its content's "
                          f"digest): let snakemake write it, or give the config file itself")
    return validate(config, ".", schema_checked=True)  # a command runs in the checkout


def write_settings(config: dict, folder: Path | str) -> Path:
    """The workflow's config (config.yaml with every --config overlay, validated) as one file that every
    command of the run reads (`--settings`): folder/<digest>.json, named by its content, so that runs with
    different overlays never share one and rewriting it changes nothing (written whole, once)."""
    from .files import write_text

    text = json.dumps(config, indent=1) + "\n"  # in config's order, which is the tables' order
    path = Path(folder) / f"{digest(config)}.json"
    if not path.is_file() or path.read_text() != text:
        write_text(path, text)
    return path
