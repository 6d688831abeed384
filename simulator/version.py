"""The simulator's version (recorded in every Result and cache key)."""

__version__ = "0.1.0"
