"""Shared fakes of the unit suite: recorded runs, probes and reports that several test
modules build on. Test modules import these, never each other."""
