"""Checks `make lint` runs beside ruff and import-linter."""
