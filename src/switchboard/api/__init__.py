"""The FastAPI gateway."""
