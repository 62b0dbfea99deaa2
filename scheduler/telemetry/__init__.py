"""What the scheduler learns from its nodes' GPU telemetry, as pure functions and small state machines.

Peers place fractional GPUs on requested amounts and never notice a pod that uses more than its share until its
neighbours crash (DESIGN.md, "Telemetry in decisions"). This package turns decoded ``NodeTelemetry`` samples into
values the scheduler acts on:

- ``overuse``: per pod and device, measured memory against the allotment (``GpuMemoryOverconsumption``, with an
  eviction decision under the ``evict`` policy), allotments nobody uses (``GhostAllocation``), memory of no pod we
  know (``UnattributedGpuMemory``), and the claims about pods of other nodes that a sample must not make;
- ``staleness``: when a node's telemetry is too old to trust (``TelemetryStale``);
- ``headroom``: the peak of used memory per device over a short window, the engine's measured view of a ``Device``.

These are pure: no asyncio, no I/O, no clock (the time is an argument, in nanoseconds), no vendor library; the
detector proper is ``detector``, its vocabulary (what it reads and decides) ``overuse``.

The package also holds the parts around them, each in its own layer: ``feed`` follows the agents' NATS streams (an
edge, like ``scheduler.kube``); ``views`` builds the detector's view of a node from the cluster state, ``live`` runs
the analysis per sample, and ``loop`` is the leader's task that takes the feed's newest samples to the analysis and
its decisions to alerts, evictions, metrics and the cycle (composition).
"""
