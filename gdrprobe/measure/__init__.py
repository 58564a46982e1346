"""The run engine: one run's settings (options), the C loops in a worker thread and their
clock, and the sessions that carry a run over the out-of-band channel (client, server,
loopback). Campaigns built from runs live in gdrprobe.campaign."""
