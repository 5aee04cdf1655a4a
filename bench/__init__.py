"""The benchmark suite behind `make bench` (python -m bench): detq against the loops it replaces."""
