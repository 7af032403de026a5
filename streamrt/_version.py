"""streamrt's version: pyproject.toml reads it from here, and every layer may import it."""

__version__ = "0.1.0"
