"""The Kubernetes edge of the scheduler: the client adapter, watches, grouping, binding, leases, events."""
