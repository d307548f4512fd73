"""An example Switchboard tool package: unit conversions as agent tools.

`toolset` (a pydantic-ai `FunctionToolset`) and `shout` (a plain function) are registered
under the `switchboard.tools` entry-point group in pyproject.toml.
"""

from __future__ import annotations

from pydantic_ai.toolsets import FunctionToolset


def celsius_to_fahrenheit(celsius: float) -> float:
    """Convert a temperature in degrees Celsius to degrees Fahrenheit."""
    return celsius * 9 / 5 + 32


def km_to_miles(km: float) -> float:
    """Convert a distance in kilometres to miles."""
    if km < 0:
        raise ValueError("a distance cannot be negative")
    return round(km / 1.609344, 6)


def shout(text: str) -> str:
    """Answer the text in capitals."""
    return text.upper()


toolset = FunctionToolset([celsius_to_fahrenheit, km_to_miles])
