"""The pure placement core: a snapshot in, a plan and a status per pending group out.

No I/O, no clock, no vendor library: time is ``Snapshot.now_ns`` and every input is an immutable value from
``model``. ``engine.Engine`` runs the configured actions over a snapshot and keeps indexes between cycles.
"""
