"""Subcommands of the ``gpuplace`` CLI that live in their own modules."""
