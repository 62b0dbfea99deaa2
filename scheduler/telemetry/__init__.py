"""What the scheduler learns from its nodes' GPU telemetry, as pure functions and small state machines.

Peers place fractional GPUs on requested amounts and never notice a pod that uses more than its share until its
neighbours crash (DESIGN.md, "Telemetry in decisions"). This package turns decoded ``NodeTelemetry`` samples into
values the scheduler acts on:

- ``overuse``: per pod and device, measured memory against the allotment (``GpuMemoryOverconsumption``, with an
  eviction decision under the ``evict`` policy), allotments nobody uses (``GhostAllocation``), memory of no pod we
  know (``UnattributedGpuMemory``), and the claims about pods of other nodes that a sample must not make;
- ``staleness``: when a node's telemetry is too old to trust (``TelemetryStale``);
- ``headroom``: the peak of used memory per device over a short window, the engine's measured view of a ``Device``.

Everything here is pure: no asyncio, no I/O, no clock (the time is an argument, in nanoseconds), no vendor library.
The consumer that follows NATS, the metrics, Events and ``Alert`` publishing wire these values up.
"""
