"""The Kubernetes edge of the scheduler: everything that reads from or writes to the API server.

``client`` is the one module that imports ``kubernetes`` (``KubeApi``, the Protocol the rest is written against, and
``KubeClient``, its implementation over ``kubernetes.aio``); ``errors`` is the error branch it maps onto;
``watches`` keeps local copies of resources exact (reflectors); ``leases`` elects the active replica; ``events``
records aggregated, rate-limited Events; grouping, binding and status writing build on these.
"""
