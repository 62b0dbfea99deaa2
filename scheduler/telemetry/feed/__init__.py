"""The telemetry feed: the scheduler's NATS side, following the agents' streams (an edge, like ``scheduler.kube``).

``consumer`` follows the bus (the last sample and health of every node from the stream at start, then live, with a
replay after every reconnect); ``readings`` decodes strictly and keeps the newest reading of each node, counting
what it rejects; ``conflicts`` raises ``TelemetryConflict`` when two live publishers claim one node, and
``rejections`` says why a node whose messages are refused went quiet (docs/telemetry-trust.md). Nothing here knows of
Kubernetes or of the analysis: ``scheduler.telemetry.loop`` takes the newest readings to ``live``.
"""
