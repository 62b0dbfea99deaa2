"""The Kubernetes edge of the scheduler: everything that reads from or writes to the API server.

``kubeapi`` is the ``KubeApi`` Protocol the rest is written against, its values and the resources it names;
``client`` implements it over ``kubernetes.aio`` (the one module that imports ``kubernetes``) and ``errors`` is the
error branch it maps onto. ``watches`` keeps local copies of resources exact (reflectors that decode each object once
into a record, with ``watchstream`` reading the raw stream); ``binding`` carries out binds and evictions;
``reservations`` creates and deletes the reservation pods of shared GPUs; ``grouper`` gives pods their PodGroups;
``statuswriter`` writes PodGroup conditions and Queue status; ``events`` records aggregated, rate-limited Events;
``leases`` elects the active replica; ``admission`` is the GPU-sharing review and ``queueadmission`` KAI's queue
review, both served by ``webhook`` (with ``certs``). Raw Kubernetes JSON is read here and in the decoders of
``scheduler.objects``, nowhere else.
"""
