"""streamrt's version (as in pyproject.toml), in a module of its own so that every layer can import it."""

__version__ = "0.1.0"
