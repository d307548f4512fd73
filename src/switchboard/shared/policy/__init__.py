"""Send policy and session visibility."""
