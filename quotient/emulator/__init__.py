"""A local Kubernetes API server for tests, demos and people: the real REST protocol over emulated nodes.

There is no API server on the build machines, so the scheduler is developed and tested against this one, through
the official ``kubernetes`` client and ``kubectl``, as against a cluster. Modules by topic:

- ``emulator``: the assembled emulator (``Emulator``, ``EmulatorThread``) and its test hooks; ``app``: the
  ``quotient emulator`` command; ``cluster``: what a fresh cluster holds (nodes from the cluster spec, namespaces,
  priority classes, ``deploy/``'s CRDs, KAI's default queues).
- ``server`` (HTTP, dispatch, watches on the wire), ``routing`` (the URL scheme, verbs, bodies, responses),
  ``views`` (JSON, Table, metadata), ``tables`` and ``printers`` (``kubectl get`` columns), ``discovery``,
  ``openapi``, ``protobuf`` (the few protobuf bodies kubectl sends), ``testhooks`` (the hooks over HTTP).
- ``api`` (the semantics of each verb), ``identity`` (a body checked against its request), ``deletion``,
  ``binding`` (``pods/binding``), ``crds``, ``schemas`` (custom resources against their CRD's structural schema),
  ``naming`` (generated names), ``defaulting``, ``validation``, ``admission`` (webhooks), ``patches``,
  ``selectors``, ``status`` (Failure values and Status bodies), ``conversions``.
- ``store`` (objects, the global resourceVersion, history), ``watching`` (fan-out), ``objects``, ``kinds``.
- ``controllers`` (the work queue, garbage collection, namespaces), ``workloads`` (Deployment, ReplicaSet, Job),
  ``training`` (PyTorchJob); ``kubelets`` (pods' lifecycle), ``deviceplugin`` (GPU allocation), ``nodefit``
  (kubelet admission), ``podenv`` (container environments), ``podstatus`` (what a kubelet writes), ``runtime``
  (the ``ContainerRuntime`` seam to emulated GPU nodes), ``reservations`` (reservation pods report their GPU);
  ``faults`` (injected errors and delays).
- ``access`` (authentication, RBAC and the record of each user's requests), ``authn`` (tokens and users, tokens
  bound to pods), ``rbac`` (the API server's RBAC decision, pure), ``tokenreview`` (``TokenReview``), ``projection``
  (the kubelets' projected ServiceAccount tokens).
"""
