"""Metrics the model logs, kept apart from the model that computes their inputs."""
