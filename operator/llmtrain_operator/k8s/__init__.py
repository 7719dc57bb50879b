"""Kubernetes I/O: reading observed state and applying actions."""
