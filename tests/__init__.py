"""The project's tests, a package so that tests/lab is tests.lab, never the lab/ it tests."""
