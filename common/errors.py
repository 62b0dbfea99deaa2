"""The one error tree of Quotient.

Every vendor library enters through a single adapter module, and that module translates the library's exceptions
into these classes (``raise GpuLost(...) from exc``), so the rest of the code never sees ``NVMLError``, nats errors
or ``ApiException``. Expected outcomes ("does not fit", "over limit") are values, never exceptions: what lives here
means something is broken or malformed.
"""

from __future__ import annotations

import enum


class QuotientError(Exception):
    """Root of every error Quotient raises on purpose."""


class ConfigError(QuotientError):
    """A flag, environment variable or config file value is invalid; the message names the setting."""


class QuantityError(QuotientError, ValueError):
    """A quantity, duration or annotation value could not be parsed; the message lists the accepted forms."""


class ClusterSpecError(QuotientError):
    """A cluster spec (YAML file or inline form) is invalid; the message names the file and line."""


class WireReason(enum.StrEnum):
    """Why a message off the wire was rejected; also the label of the rejection counters."""

    NOT_MSGPACK = "not_msgpack"
    TRUNCATED = "truncated"
    OVERSIZED = "oversized"
    WRONG_TYPE = "wrong_type"
    OUT_OF_RANGE = "out_of_range"
    MISSING_FIELD = "missing_field"
    UNKNOWN_VERSION = "unknown_version"
    SUBJECT_MISMATCH = "subject_mismatch"
    # Checked right after decoding (``wire``): amounts that no device can report, one against another.
    MEMORY_OVER_TOTAL = "memory_over_total"  # a device's used, reserved or free memory, or a process's, above its total
    DUPLICATE_DEVICE = "duplicate_device"  # two devices of one sample with one index
    # Checked by the reader against its own clock (``scheduler.telemetry.feed``): see ``--telemetry-max-skew``.
    CLOCK_SKEW = "clock_skew"


class WireError(QuotientError):
    """A message could not be decoded into a typed value; ``reason`` says why, for counting."""

    def __init__(self, reason: WireReason, message: str) -> None:
        super().__init__(f"{reason.value}: {message}")
        self.reason = reason
        self.detail = message


# --- GPUs (raised by every GpuProbe implementation: NvmlProbe maps pynvml errors to these) ---


class GpuError(QuotientError):
    """A GPU probe failed; the subclasses say how, so health reporting can name the failure kind."""


class GpuLibraryUnavailable(GpuError):
    """NVML cannot be used at all: the library is missing, the driver is not loaded, or permission is denied."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


class GpuLost(GpuError):
    """A device fell off the bus or stopped answering (NVML_ERROR_GPU_IS_LOST)."""

    def __init__(self, index: int, message: str) -> None:
        super().__init__(message)
        self.index = index


class GpuNotSupported(GpuError):
    """The device or driver does not support a query (NVML_ERROR_NOT_SUPPORTED); callers report it as absent."""


class GpuProbeError(GpuError):
    """Any other NVML failure; the message carries NVML's own text."""


# --- Message bus (NATS) ---


class BusError(QuotientError):
    """The message bus failed."""


class BusUnavailable(BusError):
    """The bus cannot be reached right now (connection refused, closed, timed out); retry later."""


class BusPermissionDenied(BusError):
    """The server refused an operation for this user (NATS permissions violation or bad credentials)."""


class NatsServerError(QuotientError):
    """The embedded nats-server could not be found, started or stopped."""
