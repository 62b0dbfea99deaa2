"""A local Kubernetes API server for tests, demos and people: the real REST protocol over emulated nodes.

There is no API server on the build machines, so the scheduler is developed and tested against this one, through
the official ``kubernetes`` client and ``kubectl``, as against a cluster. Modules by topic:

- ``emulator``: the assembled emulator (``Emulator``, ``EmulatorThread``) and its test hooks; ``app``: the
  ``quotient emulator`` command; ``cluster``: what a fresh cluster holds (nodes from the cluster spec, namespaces,
  priority classes, ``deploy/``'s CRDs, KAI's default queues).
- ``server`` (HTTP, dispatch, watches on the wire), ``routing`` (the URL scheme, verbs, bodies, responses),
  ``views`` (JSON, Table, metadata), ``tables`` and ``printers`` (``kubectl get`` columns), ``discovery``,
  ``openapi`` (with the CRDs' schemas, for ``kubectl explain``), ``protobuf`` and ``protoschemas`` (the protobuf
  bodies kubectl's typed clients send), ``podlogs`` (``pods/log``), ``podproxy`` (``pods/proxy``), ``testhooks``
  (the hooks over HTTP).
- ``api`` (the semantics of each verb), ``identity`` (a body checked against its request), ``deletion``,
  ``binding`` (``pods/binding``), ``crds``, ``schemas`` (custom resources against their CRD's structural schema),
  ``naming`` (generated names), ``defaulting``, ``validation``, ``admission`` (webhooks), ``patches``,
  ``selectors``, ``status`` (Failure values and Status bodies), ``conversions``.
- ``store`` (objects, the global resourceVersion, history), ``watching`` (fan-out), ``objects``, ``kinds``.
- ``controllers`` (the work queue, garbage collection, namespaces), ``workloads`` (Deployment, ReplicaSet, Job),
  ``training`` (PyTorchJob); ``kubelets`` (pods' lifecycle), ``deviceplugin`` (GPU allocation), ``nodefit``
  (kubelet admission), ``podenv`` (container environments), ``podstatus`` (what a kubelet writes), ``runtime``
  (the ``ContainerRuntime`` seam to emulated GPU nodes), ``containerlogs`` (what containers print),
  ``kubeletevents`` (the kubelet's Events), ``reservations`` (reservation pods report their GPU);
  ``defaultscheduler`` (a stand-in for kube-scheduler, off unless asked); ``faults`` (injected errors and delays).
- ``access`` (authentication, RBAC and the record of each user's requests), ``authn`` (tokens and users, tokens
  bound to pods), ``rbac`` (the API server's RBAC decision, pure), ``impersonation`` (``kubectl --as``),
  ``accessreviews`` (``kubectl auth can-i``, ``whoami``), ``tokenreview`` (``TokenReview``), ``projection`` (the
  kubelets' projected ServiceAccount tokens).
"""
