"""The scheduler's in-memory view of the cluster: one writer applies events; each cycle reads a snapshot."""
