"""Subcommands of the ``gpuplace`` CLI that live in their own modules, registered at the end of
``cli.py``."""
