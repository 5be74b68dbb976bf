"""The ``kvinject`` command line: parses, calls the Python API and renders; one module per
command, the shared flags in :mod:`kvinject.cli.flags`. Nothing is imported here, so that
``kvinject.cli.launch`` starts before the heavy modules load."""
