"""Schemas placeholder."""
SCHEMAS: dict = {}
COMMANDS: dict = {}
