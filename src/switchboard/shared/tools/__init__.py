"""The session tools, one module per tool."""
