"""Switchboard: session tools for AI agents on Celery + Redis."""

__version__ = "0.1.0"
