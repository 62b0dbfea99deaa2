"""The trace simulator: replay workloads through the placement core on a simulated cluster.

``openb`` reads the Alibaba GPU-sharing trace, ``experiment`` runs the FGD paper's experiment on it (through the
placement engine itself, ``enginereplay``, or the independent ``replay`` as a cross-check), ``policies`` holds the
published baselines and ours, ``variants`` draws other members of the trace's families, and ``workload`` replays a
cluster spec over simulated time (``arrivals`` turns the spec into the engine's model, ``workloadreport`` holds and
prints what the replay measured).
"""
