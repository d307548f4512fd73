"""Reply-back loops, announces and spawns."""
