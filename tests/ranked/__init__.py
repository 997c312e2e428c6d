"""The ranked suites: tests written once, run at every world size (see tests/test_ranked_suites.py)."""
