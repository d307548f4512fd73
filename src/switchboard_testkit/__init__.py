"""Machinery for the tests and the benchmark, never imported by the product: private Redis
Cluster and Sentinel groups (`redis_cluster`, `redis_sentinel`), the bulk dataset loader
(`bulk`), a fake OpenAI-compatible model server (`fake_model`), a webhook receiver and small
helpers for driving processes, HTTP and SSE from a test."""
