"""Building the mock driver: ``mock_nvml.c`` against NVIDIA's ``nvml.h``, compiled by the system's C compiler into a
``libnvidia-ml.so.1`` per driver profile, cached, and handed to processes the way a real driver is found.

- The header comes from the ``nvidia-nvml-dev`` package (a dev dependency), found through its installed metadata, so
  the mock is compiled against the very ABI pynvml speaks to; the C sources (``mock_nvml.c``, the ABI;
  ``mock_state.c`` and ``.h``, the state file) ship as package data beside this module.
- Each build is cached under ``$XDG_CACHE_HOME/quotient/nvml-mock/<digest>/`` (``~/.cache`` by default), the digest
  covering the header, the source and the profile's flags: a changed header, source or profile is a new build, and
  an unchanged one is never compiled twice. Nothing is written inside the repository. A build goes to a temporary
  name and is renamed into place, so processes building at once cannot see half a library.
- The dynamic loader reads ``LD_LIBRARY_PATH`` only when a process starts, so a process that is to load the mock gets
  the build's directory on it from its parent (``MockLibrary.environment``); a process that is already running loads
  it by absolute path before pynvml's first ``nvmlInit`` (``MockLibrary.preload``): pynvml then opens
  ``libnvidia-ml.so.1`` by that name and the loader finds the library already loaded under the same soname.
- Not being able to build (no compiler, no header) is an outcome, ``Unavailable`` with the reason, not an exception:
  the demo falls back to fake GPUs on it and says so; tests and CI decide whether that is a failure.
"""

from __future__ import annotations

import ctypes
import dataclasses
import hashlib
import importlib.metadata
import importlib.resources
import os
import shlex
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Final

from quotient.nvmlmock import profiles, state

LIBRARY_NAME: Final = "libnvidia-ml.so.1"
HEADER_PACKAGE: Final = "nvidia-nvml-dev"
SOURCES: Final = ("mock_nvml.c", "mock_state.c")
HEADERS: Final = ("mock_state.h",)
# Flags of every build; they are part of the digest, so changing them rebuilds. Hidden visibility: only what the
# sources mark (NVML's functions) is exported.
_FLAGS: Final = (
    "-shared",
    "-fPIC",
    "-O2",
    "-std=c11",
    "-Wall",
    "-Wextra",
    "-fvisibility=hidden",
    f"-Wl,-soname,{LIBRARY_NAME}",
)
_COMPILE_TIMEOUT_S: Final = 120

_preloaded: dict[str, Path] = {}
_preload_lock = threading.Lock()


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class MockLibrary:
    """A built mock driver of ``profile`` at ``path`` (a file named ``libnvidia-ml.so.1``)."""

    profile: profiles.DriverProfile
    path: Path

    @property
    def directory(self) -> Path:
        return self.path.parent

    def environment(self, *, state_file: Path, base: Mapping[str, str] | None = None) -> dict[str, str]:
        """The environment of a process that is to load this mock over ``state_file`` at its start: ``base`` (this
        process's environment by default) with the build's directory first on ``LD_LIBRARY_PATH``."""
        env = dict(os.environ if base is None else base)
        search = [str(self.directory), *(part for part in env.get("LD_LIBRARY_PATH", "").split(os.pathsep) if part)]
        env["LD_LIBRARY_PATH"] = os.pathsep.join(search)
        env[state.STATE_ENV] = str(state_file)
        return env

    def preload(self, *, state_file: Path) -> None:
        """Load this mock into the running process, over ``state_file``, before pynvml first initialises.

        One process holds one NVML: a second, different mock cannot replace the first (``RuntimeError``)."""
        with _preload_lock:
            loaded = _preloaded.get(LIBRARY_NAME)
            if loaded is not None and loaded != self.path:
                raise RuntimeError(f"this process already loaded the NVML mock {loaded}; it cannot load {self.path}")
            os.environ[state.STATE_ENV] = str(state_file)
            ctypes.CDLL(str(self.path), mode=ctypes.RTLD_GLOBAL)
            _preloaded[LIBRARY_NAME] = self.path


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Unavailable:
    """The mock cannot be built here, and why."""

    reason: str


def find_header() -> Path | Unavailable:
    """``nvml.h`` of the installed ``nvidia-nvml-dev`` distribution."""
    try:
        distribution = importlib.metadata.distribution(HEADER_PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        return Unavailable(reason=f"{HEADER_PACKAGE} is not installed (a dev dependency: pip install -e '.[dev]')")
    for file in distribution.files or ():
        if file.name == "nvml.h":
            path = Path(str(distribution.locate_file(file)))
            if path.is_file():
                return path
    return Unavailable(reason=f"{HEADER_PACKAGE} {distribution.version} is installed but holds no nvml.h")


def find_compiler(environ: Mapping[str, str] | None = None) -> list[str] | Unavailable:
    """``$CC`` (split as a shell would), else ``cc``, ``gcc`` or ``clang`` from ``PATH``."""
    env = os.environ if environ is None else environ
    configured = env.get("CC", "").strip()
    if configured:
        command = shlex.split(configured)
        if shutil.which(command[0], path=env.get("PATH")) is None:
            return Unavailable(reason=f"CC={configured!r} is not an executable on PATH")
        return command
    for name in ("cc", "gcc", "clang"):
        found = shutil.which(name, path=env.get("PATH"))
        if found is not None:
            return [found]
    return Unavailable(reason="no C compiler (cc, gcc or clang on PATH, or $CC)")


def cache_root(environ: Mapping[str, str] | None = None) -> Path:
    """``$XDG_CACHE_HOME/quotient/nvml-mock``, ``~/.cache/quotient/nvml-mock`` without it."""
    env = os.environ if environ is None else environ
    base = env.get("XDG_CACHE_HOME") or str(Path(env.get("HOME") or Path.home()) / ".cache")
    return Path(base) / "quotient" / "nvml-mock"


def digest(*, header: bytes, sources: Mapping[str, bytes], flags: Sequence[str]) -> str:
    """The cache key of a build: NVIDIA's header, our sources (by name) and every flag (the profile's among them)."""
    h = hashlib.sha256()
    parts = [header, *(part for name in sorted(sources) for part in (name.encode(), sources[name]))]
    for part in (*parts, "\0".join(flags).encode()):
        h.update(len(part).to_bytes(8, "big"))
        h.update(part)
    return h.hexdigest()[:32]


def sources() -> dict[str, bytes]:
    """The mock's C sources and header, by file name, as shipped in this package."""
    package = importlib.resources.files(__package__)
    return {name: (package / name).read_bytes() for name in (*SOURCES, *HEADERS)}


def build(
    profile: profiles.DriverProfile = profiles.CURRENT,
    *,
    cache: Path | None = None,
    environ: Mapping[str, str] | None = None,
) -> MockLibrary | Unavailable:
    """The mock of ``profile``, from the cache or compiled now."""
    header = find_header()
    if isinstance(header, Unavailable):
        return header
    compiler = find_compiler(environ)
    if isinstance(compiler, Unavailable):
        return compiler
    code = sources()
    flags = (*_FLAGS, *profile.defines())
    key = digest(header=header.read_bytes(), sources=code, flags=flags)
    directory = (cache or cache_root(environ)) / key
    target = directory / LIBRARY_NAME
    if target.is_file():
        return MockLibrary(profile=profile, path=target)
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix=".build-", dir=directory) as scratch:
            return _compile(
                compiler=compiler,
                flags=flags,
                header=header,
                code=code,
                scratch=Path(scratch),
                target=target,
                profile=profile,
            )
    except OSError as exc:
        return Unavailable(reason=f"cannot build the NVML mock in its cache directory {directory}: {exc}")


def _compile(
    *,
    compiler: Sequence[str],
    flags: Sequence[str],
    header: Path,
    code: Mapping[str, bytes],
    scratch: Path,
    target: Path,
    profile: profiles.DriverProfile,
) -> MockLibrary | Unavailable:
    """Compile ``code`` (written out in ``scratch``) into ``target``, atomically."""
    for name, text in code.items():
        (scratch / name).write_bytes(text)
    built = scratch / LIBRARY_NAME
    command = [
        *compiler,
        *flags,
        f"-I{header.parent}",
        "-o",
        str(built),
        *(str(scratch / name) for name in SOURCES),
        "-lpthread",
    ]
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=_COMPILE_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return Unavailable(reason=f"the C compiler failed to run ({shlex.join(command)}): {exc}")
    if result.returncode != 0:
        output = (result.stderr or result.stdout).strip()[-2000:]
        return Unavailable(reason=f"compiling the NVML mock failed ({shlex.join(command)}):\n{output}")
    built.replace(target)
    return MockLibrary(profile=profile, path=target)
