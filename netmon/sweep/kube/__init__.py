"""The sweep's scheduler on Kubernetes: one JobSet per pair that Kueue admits, the pods'
ranks, and how each pair came out."""
