"""The Celery app and its thin tasks."""
