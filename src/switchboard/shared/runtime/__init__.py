"""Agent runs on pydantic-ai: models, transcript conversion, execution."""
