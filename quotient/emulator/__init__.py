"""A local Kubernetes API server for tests, demos and people: the real REST protocol over emulated nodes.

There is no API server on the build machines, so the scheduler is developed and tested against this one, through
the official ``kubernetes`` client and ``kubectl``, as against a cluster. Modules by topic:

- ``emulator``: the assembled emulator (``Emulator``, ``EmulatorThread``) and its test hooks; ``app``: the
  ``quotient emulator`` command; ``cluster``: what a fresh cluster holds (nodes from the cluster spec, namespaces,
  priority classes, KAI's default queues).
- ``server`` (HTTP, routing, watches on the wire), ``views`` (JSON, Table, metadata), ``tables``, ``discovery``,
  ``openapi``, ``protobuf`` (the few protobuf bodies kubectl sends), ``testhooks`` (the hooks over HTTP).
- ``api`` (the semantics of each verb), ``defaulting``, ``validation``, ``admission`` (webhooks), ``patches``,
  ``selectors``, ``status`` (Failure values and Status bodies), ``conversions``.
- ``store`` (objects, the global resourceVersion, history), ``watching`` (fan-out), ``objects``, ``kinds``.
- ``controllers`` (the work queue, garbage collection, namespaces), ``workloads`` (Deployment, ReplicaSet, Job),
  ``training`` (PyTorchJob); ``kubelets`` (pods' lifecycle, the device plugin), ``nodefit`` (kubelet admission),
  ``podenv`` (container environments), ``runtime`` (the ``ContainerRuntime`` seam to emulated GPU nodes);
  ``faults`` (injected errors and delays).
"""
