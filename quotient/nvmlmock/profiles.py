"""Driver profiles: which versioned NVML symbols a driver of each era exports, and the version strings it reports.

A profile becomes ``-D`` flags for ``mock_nvml.c``; a symbol a profile leaves out is not in the built library at all,
which pynvml turns into ``NVML_ERROR_FUNCTION_NOT_FOUND``, exactly as with a real driver of that age. Where each
symbol came and went (NVIDIA's nvml.h as published with each driver branch, as nvidia-settings mirrors it):

- ``nvmlDeviceGetMemoryInfo_v2`` (driver-reserved memory reported apart) arrived with R510; R470 answers only v1,
  whose ``used`` includes the reservation.
- ``nvmlDeviceGet{Compute,Graphics}RunningProcesses_v3`` arrived with R510, and were removed again in 535.98 (they had
  changed their struct without a version bump in 535.43), so the long-lived R535 branch answers ``_v2`` only; later
  branches export ``_v3`` again.
- ``nvmlDeviceGetTemperatureV`` (a versioned struct) is recent: neither R470 nor R535 has it.

Every profile keeps what pynvml 13 calls unconditionally and those drivers all have: ``nvmlInitWithFlags``,
``nvmlDeviceGetCount_v2``, ``nvmlDeviceGetHandleByIndex_v2``, ``nvmlEventSetWait_v2``, the v1 and v2 process
queries, ``nvmlDeviceGetTemperature``, ``nvmlDeviceGetMigMode``.
"""

from __future__ import annotations

import dataclasses
import types
from collections.abc import Mapping


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class DriverProfile:
    """One driver era. ``name`` is how commands and tests choose it."""

    name: str
    driver_version: str
    nvml_version: str
    memory_info_v2: bool
    running_processes_v3: bool
    temperature_v: bool

    def defines(self) -> tuple[str, ...]:
        """The ``-D`` flags that build this profile."""
        flags = [f'-DMOCK_DRIVER_VERSION="{self.driver_version}"', f'-DMOCK_NVML_VERSION="{self.nvml_version}"']
        if self.memory_info_v2:
            flags.append("-DMOCK_MEMORY_INFO_V2")
        if self.running_processes_v3:
            flags.append("-DMOCK_RUNNING_PROCESSES_V3")
        if self.temperature_v:
            flags.append("-DMOCK_TEMPERATURE_V")
        return tuple(flags)


R470 = DriverProfile(
    name="r470",
    driver_version="470.256.02",
    nvml_version="11.470.256.02",
    memory_info_v2=False,
    running_processes_v3=False,
    temperature_v=False,
)
R535 = DriverProfile(
    name="r535",
    driver_version="535.247.01",
    nvml_version="12.535.247.01",
    memory_info_v2=True,
    running_processes_v3=False,
    temperature_v=False,
)
R580 = DriverProfile(
    name="r580",
    driver_version="580.65.06",
    nvml_version="13.580.65.06",
    memory_info_v2=True,
    running_processes_v3=True,
    temperature_v=True,
)

PROFILES: Mapping[str, DriverProfile] = types.MappingProxyType({p.name: p for p in (R470, R535, R580)})
CURRENT = R580
"""The profile of a current driver: what the demo and ``bench agent --nvml-mock`` run on."""
