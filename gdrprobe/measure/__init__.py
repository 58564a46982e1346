"""Measurements: the C loops in a worker thread, the client/server/loopback session, the
run settings, the host/GPU A/B and its verdict."""
