"""CLI command groups kept in their own modules and registered at the end of ``cli.py``."""
