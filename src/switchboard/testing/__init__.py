"""Test and benchmark helpers shipped with the product (fake model server)."""
