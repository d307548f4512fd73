"""The OpenAI Batches API's domain: line plans, their runs, admission and ending."""
