"""The domain: keys, config, store, policy, tools, runtime. Knows nothing of FastAPI or Celery."""
