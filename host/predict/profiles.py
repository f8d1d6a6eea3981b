"""Device profiles (``dlbooster predict``): per-operator cost functions (:class:`Profile`,
:func:`op_time`), the shipped GPU profiles built from public peak figures, and the
calibrated profiles saved under :func:`profile_dir`."""

from __future__ import annotations

import dataclasses
import json
import math
import os
from dataclasses import asdict, dataclass
from pathlib import Path

from dlbooster.predict.work import Op

__all__ = ["HOST_US_PER_IMAGE", "Profile", "op_cost", "op_time", "kernel_time", "memory_time",
           "SHIPPED_PROFILES", "profile_dir", "load_profile", "PROFILE_LIMITS", "profile_from_json"]


#: Host runtime cost per image, microseconds, file reads included: ``dlbooster bench host``
#: (docs/benchmarks.md, median of eight epochs on the 2-core build machine).
HOST_US_PER_IMAGE = 208.0

@dataclass
class Profile:
    """Cost functions of one device (all times in seconds, sizes in bytes).

    Attributes:
        name, kind: profile name; ``cpu`` or ``gpu``.
        source: how the figures were obtained (``measured ...`` by :func:`calibrate`, or
            ``public peak figures ...``).
        threads, procs: threads per process and processes running at once when measured.
        conv: ``{"conv:k3": cost, "dgrad:dw": cost, ...}`` per kernel kind and class;
            ``gemm``: the matrix-product cost. A cost is ``{"dims": [a, m, n, k, b]}``
            (``log t = a + m log M + n log N + k log K + b log bytes`` over the product's
            dimensions, :class:`Op` ``dims``; fitted to measurements) or
            ``{"roof": [t0, flops/s, bytes/s]}`` (``t0 + max(flops / rate, bytes / bw)``).
            A fitted cost may also hold ``"peak"``: the highest rate (flops/s) measured
            for it; no prediction is faster than its flops at that rate.
        memory: ``{operator: cost}``, a cost being ``[t0, bytes/s]`` or a measured
            table ``[[bytes, ...], [seconds, ...]]`` (:func:`memory_time`); ``"*"``
            prices unlisted operators.
        view: seconds per view operator (dispatch only).
        allreduce: ``[latency, bytes/s]`` of the ring all-reduce between this device's
            processes on one node (``2 (p - 1) latency + 2 (p - 1) / p * bytes / rate``).
        overlap: share of the all-reduce time under backward compute that is hidden (a
            measured CPU profile: 0, gloo's work competes for the cores the backward
            uses; a GPU: 1, NCCL runs on its own stream).
        decode_per_core: JPEG decodes per second per host core (ImageNet-sized photo).
        host_us_per_image: host runtime cost per image, microseconds (``bench host``).
        fault: seconds per byte of a freshly mapped allocation's first writing (page
            faults: the kernel maps and zeroes each page), charged on ``Op.fresh``;
            measured by :func:`calibrate` with the profile's threads and processes,
            whose kernel timings exclude it. 0: no such cost (GPU profiles: the CUDA
            caching allocator reuses memory; profiles calibrated before it was measured).
        step_factor: what a training step costs over its operators priced one by one
            (module calls, autograd and the optimizer's loop; kernels running beside
            each other's data in the caches): :func:`calibrate` trains the
            :data:`REFERENCE_MODELS` for a few iterations and takes the geometric mean
            of measured over priced step time. Every operator's price is multiplied by
            it (page faults are not). 1: not measured (shipped profiles, ``quick``
            calibrations, profiles calibrated before it was).
    """

    name: str
    kind: str
    source: str
    threads: int
    procs: int
    conv: dict
    gemm: dict
    memory: dict
    view: float
    allreduce: list
    overlap: float
    decode_per_core: float
    host_us_per_image: float
    fault: float = 0.0
    step_factor: float = 1.0

    def save(self, path: str | os.PathLike) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(asdict(self), indent=1) + "\n")
        return path


def op_cost(spec: dict, op: Op) -> float:
    if "dims" in spec:
        a, *b = spec["dims"]
        logs = [math.log(max(v, 1.0)) for v in (*op.dims, op.bytes)]
        # The log-linear fit's exponents sum below 1 (small products waste more), so
        # beyond the calibrated sizes it would promise rates no kernel reached.
        try:
            fitted = math.exp(a + sum(c * v for c, v in zip(b, logs)))
        except OverflowError:       # beyond a float: predict() refuses the non-finite time
            fitted = math.inf
        return max(fitted, op.flops / spec.get("peak", math.inf))
    t0, rate, bw = spec["roof"]
    return t0 + max(op.flops / rate, op.bytes / bw)


def op_time(profile: Profile, op: Op) -> float:
    """Predicted seconds of one operator on ``profile``: its kernel times the profile's
    ``step_factor``, plus the page faults of its fresh outputs (``op.fresh *
    profile.fault``)."""
    return kernel_time(profile, op) * profile.step_factor + op.fresh * profile.fault


def kernel_time(profile: Profile, op: Op) -> float:
    if op.kind == "view":
        return profile.view
    if op.kind in ("conv", "dgrad", "wgrad"):
        spec = profile.conv.get(f"{op.kind}:{op.conv_class}") or profile.conv[f"{op.kind}:k3"]
        return op_cost(spec, op)
    if op.kind == "gemm":
        return op_cost(profile.gemm, op)
    return memory_time(profile.memory.get(op.name) or profile.memory["*"], op.bytes)


def memory_time(spec: list, nbytes: float) -> float:
    """``[t0, bytes/s]``, or a measured table ``[[bytes...], [seconds...]]`` interpolated
    linearly in log-log; below its smallest size its first time, above its largest in
    proportion to the bytes (bandwidth bound)."""
    if not isinstance(spec[0], list):
        t0, bw = spec
        return t0 + nbytes / bw
    sizes, times = spec
    if nbytes <= sizes[0]:
        return times[0]
    if nbytes >= sizes[-1]:
        return times[-1] * nbytes / sizes[-1]
    hi = next(i for i, size in enumerate(sizes) if nbytes <= size)
    x0, x1 = math.log(sizes[hi - 1]), math.log(sizes[hi])
    y0, y1 = math.log(times[hi - 1]), math.log(times[hi])
    return math.exp(y0 + (y1 - y0) * (math.log(nbytes) - x0) / (x1 - x0))


# --------------------------------------------------------------------------- calibration

def _gpu_profile(name: str, peak_tflops: float, hbm_gbps: float, link_gbps: float, note: str) -> Profile:
    """A GPU profile from public peak figures: convolutions and matrix products at half the
    peak (cuDNN/cuBLAS typically reach 40-70 % on ResNet layers), memory-bound kernels at
    80 % of the memory bandwidth, 10 us launch and framework cost per kernel, ring
    all-reduce at the link's bus bandwidth with 10 us per step, communication fully
    overlapped with backward compute (NCCL on its own stream)."""
    roof = {"roof": [10e-6, 0.5 * peak_tflops * 1e12, 0.8 * hbm_gbps * 1e9]}
    conv = {f"{kind}:{cls}": roof for kind in ("conv", "dgrad", "wgrad") for cls in ("k1", "k3", "kn", "group")}
    # Depthwise convolutions do not use tensor cores: memory-bound.
    conv.update({f"{kind}:dw": {"roof": [10e-6, 0.05 * peak_tflops * 1e12, 0.5 * hbm_gbps * 1e9]}
                 for kind in ("conv", "dgrad", "wgrad")})
    return Profile(name=name, kind="gpu", source=f"public peak figures ({note}); not measured",
                   threads=0, procs=1, conv=conv, gemm=roof, memory={"*": [10e-6, 0.8 * hbm_gbps * 1e9]},
                   view=5e-6, allreduce=[10e-6, link_gbps * 1e9], overlap=1.0, decode_per_core=600.0,
                   host_us_per_image=HOST_US_PER_IMAGE)


#: GPU profiles from vendor data sheets (dense TF32 tensor throughput, which PyTorch's
#: cuDNN convolutions use by default; HBM bandwidth; NVLink/PCIe bus bandwidth).
SHIPPED_PROFILES = {
    "a100": lambda: _gpu_profile("a100", 156, 1555, 240, "A100 SXM4 40GB: 156 TFLOPS TF32, 1,555 GB/s, NVLink3"),
    "v100": lambda: _gpu_profile("v100", 15.7, 900, 130, "V100 SXM2: 15.7 TFLOPS FP32, 900 GB/s, NVLink2"),
    "h100": lambda: _gpu_profile("h100", 495, 3350, 370, "H100 SXM5: 495 TFLOPS TF32, 3,350 GB/s, NVLink4"),
    "t4": lambda: _gpu_profile("t4", 8.1, 320, 12, "T4: 8.1 TFLOPS FP32, 320 GB/s, PCIe 3"),
}


def profile_dir() -> Path:
    """Where calibrated profiles are kept (``$DLBOOSTER_CACHE/profiles``: the build cache's
    folder, :func:`dlbooster.sim.flow.cache_path`)."""
    from dlbooster.sim.flow import cache_path

    return cache_path() / "profiles"


def load_profile(name: str, *, procs: int = 1) -> Profile:
    """A shipped profile (:data:`SHIPPED_PROFILES`), a calibrated one by name, ``cpu``
    (the calibrated ``cpu-p{procs}``), or a JSON file path.

    Raises:
        FileNotFoundError: no such profile (run ``dlbooster predict calibrate``).
        ValueError: the file is not JSON or not a profile (:func:`profile_from_json`).
    """
    if name in SHIPPED_PROFILES:
        return SHIPPED_PROFILES[name]()
    path = Path(name)
    if not path.suffix and os.sep not in name and not path.is_file():     # a calibrated profile's name
        path = profile_dir() / f"{f'cpu-p{procs}' if name == 'cpu' else name}.json"
    if not path.exists():
        how = {"cpu": f" --procs {procs}", "cuda": " --device cuda"}.get(name, f" --out {path}")
        raise FileNotFoundError(f"no device profile {name!r} ({path}); run `dlbooster predict calibrate{how}` "
                                f"or choose one of {', '.join(SHIPPED_PROFILES)}")
    try:
        raw = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as exc:     # JSONDecodeError is a ValueError
        raise ValueError(f"{path}: not a readable device profile ({exc})") from None
    try:
        return profile_from_json(raw)
    except ValueError as exc:
        raise ValueError(f"{path}: not a device profile: {exc}") from None


#: What :func:`profile_from_json` accepts: a time (seconds per operator, the all-reduce's
#: latency) of at most an hour; a rate (flops/s, bytes/s, decodes/s) from 0.001 to 1e21 per
#: second (an infinite all-reduce rate or peak: none, as in a one-process profile); a
#: fitted cost's coefficients within +-100 (calibrations give about -26 to 3); a
#: ``step_factor`` from 0.01 to 100 (calibrations give about 1.1); page faults at most a
#: second per byte; host work at most an hour per image.
PROFILE_LIMITS = {"seconds": 3600.0, "rate": (1e-3, 1e21), "coefficient": 100.0, "step_factor": (0.01, 100.0),
                  "fault": 1.0, "host_us_per_image": 3600e6}


def profile_from_json(raw: object) -> Profile:
    """A :class:`Profile` from its JSON object (:meth:`Profile.save`'s), checked: every
    field present and no other, every number finite and within :data:`PROFILE_LIMITS`
    (times at least 0 and at most an hour, rates above 0 and finite except where
    infinite means free: one process's all-reduce, no measured peak), so that no
    prediction comes out negative, infinite or divides by zero (and :func:`predict`
    refuses any time that still overflows a float).

    Raises:
        ValueError: what is wrong, naming the field.
    """
    if not isinstance(raw, dict):
        raise ValueError(f"a JSON object is needed, not {type(raw).__name__}")
    fields = {f.name: f for f in dataclasses.fields(Profile)}
    required = {n for n, f in fields.items() if f.default is dataclasses.MISSING}
    if missing := sorted(required - set(raw)):
        raise ValueError(f"missing {', '.join(missing)}")
    if unknown := sorted(set(raw) - set(fields)):
        raise ValueError(f"unknown field(s) {', '.join(unknown)}")
    low, high = PROFILE_LIMITS["rate"]

    def number(value, what: str, *, rate: bool = False, signed: bool = False, free: bool = False,
               most: float = PROFILE_LIMITS["seconds"], unit: str = "seconds") -> None:
        """A time (0 to ``most`` ``unit``), a rate (``free``: may be infinite) or a
        fitted coefficient (``signed``)."""
        if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
            raise ValueError(f"{what} must be a number, not {value!r}")
        if rate:
            if not value > 0:
                raise ValueError(f"{what} is a rate and must be above 0, not {value!r}")
            if not (free and math.isinf(value)) and not low <= value <= high:
                also = " or Infinity" if free else ""
                raise ValueError(f"{what} is a rate per second, from {low:g} to {high:g}{also}, not {value!r}")
        elif signed:
            if not -PROFILE_LIMITS["coefficient"] <= value <= PROFILE_LIMITS["coefficient"]:
                raise ValueError(f"{what} must be finite and within +-{PROFILE_LIMITS['coefficient']:g}, not {value!r}")
        elif not 0 <= value <= most:
            raise ValueError(f"{what} must be finite, at least 0 and at most {most:g} {unit}, not {value!r}")

    def pair(value, what: str, *, free: bool = False) -> None:          # [t0 seconds, bytes/s or flops/s]
        if not isinstance(value, list) or len(value) != 2:
            raise ValueError(f"{what} must be [seconds, rate], not {value!r}")
        number(value[0], f"{what}[0]")
        number(value[1], f"{what}[1]", rate=True, free=free)

    def cost(value, what: str) -> None:
        if not isinstance(value, dict) or not ({"dims", "roof"} & set(value)):
            raise ValueError(f"{what} must be {{'dims': [a, m, n, k, b]}} or {{'roof': [t0, flops/s, bytes/s]}}")
        if "dims" in value:
            dims = value["dims"]
            if not isinstance(dims, list) or len(dims) != 5:
                raise ValueError(f"{what}.dims must be 5 numbers, not {dims!r}")
            for i, d in enumerate(dims):
                number(d, f"{what}.dims[{i}]", signed=True)
        if "roof" in value:
            roof = value["roof"]
            if not isinstance(roof, list) or len(roof) != 3:
                raise ValueError(f"{what}.roof must be [t0, flops/s, bytes/s], not {roof!r}")
            number(roof[0], f"{what}.roof[0]")
            number(roof[1], f"{what}.roof[1]", rate=True)
            number(roof[2], f"{what}.roof[2]", rate=True)
        if "peak" in value:
            number(value["peak"], f"{what}.peak", rate=True, free=True)

    for name in ("name", "kind", "source"):
        if not isinstance(raw[name], str):
            raise ValueError(f"{name} must be a string, not {raw[name]!r}")
    if raw["kind"] not in ("cpu", "gpu"):
        raise ValueError(f"kind must be 'cpu' or 'gpu', not {raw['kind']!r}")
    for name in ("threads", "procs"):
        if isinstance(raw[name], bool) or not isinstance(raw[name], int) or raw[name] < 0:
            raise ValueError(f"{name} must be a whole number, not {raw[name]!r}")
    for name in ("conv", "memory"):
        if not isinstance(raw[name], dict):
            raise ValueError(f"{name} must be an object, not {raw[name]!r}")
    for kind, value in raw["conv"].items():
        cost(value, f"conv[{kind!r}]")
    cost(raw["gemm"], "gemm")
    for op, spec in raw["memory"].items():
        what = f"memory[{op!r}]"
        if isinstance(spec, list) and len(spec) == 2 and all(isinstance(x, list) for x in spec):
            sizes, times = spec
            if not sizes or len(sizes) != len(times):
                raise ValueError(f"{what} must be a table [[bytes, ...], [seconds, ...]] of equal lengths")
            for i, (size, t) in enumerate(zip(sizes, times)):
                if isinstance(size, bool) or not isinstance(size, (int, float)) or not 0 < size < math.inf:
                    raise ValueError(f"{what} bytes[{i}] must be a finite number above 0, not {size!r}")
                number(t, f"{what} seconds[{i}]")
                if not t > 0:
                    raise ValueError(f"{what} seconds[{i}] must be above 0, not {t!r}")
            if any(b <= a for a, b in zip(sizes, sizes[1:])):
                raise ValueError(f"{what}: the table's sizes must rise")
        else:
            pair(spec, what)
    number(raw["view"], "view")
    pair(raw["allreduce"], "allreduce", free=True)
    number(raw["overlap"], "overlap")
    if raw["overlap"] > 1:
        raise ValueError(f"overlap is a share, 0 to 1, not {raw['overlap']!r}")
    number(raw["decode_per_core"], "decode_per_core", rate=True)
    number(raw["host_us_per_image"], "host_us_per_image", most=PROFILE_LIMITS["host_us_per_image"],
           unit="microseconds")
    number(raw.get("fault", 0.0), "fault", most=PROFILE_LIMITS["fault"], unit="seconds per byte")
    step_low, step_high = PROFILE_LIMITS["step_factor"]
    step = raw.get("step_factor", 1.0)
    if isinstance(step, bool) or not isinstance(step, (int, float)) or not step_low <= step <= step_high:
        raise ValueError(f"step_factor must be from {step_low:g} to {step_high:g}, not {step!r}")
    return Profile(**raw)
