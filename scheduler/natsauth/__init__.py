"""The NATS auth callout: each agent may publish only its own node's subjects, and NATS enforces it.

``policy`` is the rule (pure: a TokenReview in, a grant of two subjects or a denial with its reason out);
``callout`` is the service every scheduler replica runs over the bus and the Kubernetes edge
(``scheduler.kube.tokenreview``). The JWTs it reads and writes are ``common.natsjwt``'s. ``docs/telemetry-trust.md``
says what it changes for the telemetry consumer; ``deploy/README.md`` how it is set up.
"""
