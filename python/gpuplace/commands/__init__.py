"""Click command groups of the ``gpuplace`` command line, one module per group."""
