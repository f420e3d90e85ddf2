"""A second, deliberately simple implementation of the fraction-to-resources rules, written
apart from the core from the README and policies/README.md, and the differential tests
that hold the core to it."""
