"""Kubernetes objects as typed records, and the pure decoders that make them (KAI's objects and our annotations).

``records`` holds the frozen record types; ``pods``, ``nodes``, ``queues`` and ``podgroups`` decode the API's JSON
into them (each once, at the reflector); ``gpurequest`` reads KAI's GPU-sharing annotations, with ``nvfractions``
for KAI v0.18's per-container keys (the admission webhook uses the very same reading, so the two never disagree);
``grouping`` decides a pod's PodGroup as KAI's pod-grouper does; ``durations`` reads KAI's Go durations. Everything
here is pure. Together with the Kubernetes edge (``scheduler.kube``) this is the only place that reads raw
Kubernetes JSON; the names it reads are ``common.names``.
"""
