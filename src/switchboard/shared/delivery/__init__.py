"""Channel adapters and delivery records."""
