"""Verbs: pyverbs loaded on demand, the device inventory, the endpoint (context, PD, CQ,
QPs) and the raw handles the C loops drive."""
