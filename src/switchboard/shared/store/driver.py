"""What the store's clients tell redis-py about themselves (`DRIVER_INFO`).

redis-py reads its own version from the installed package's metadata for each connection
it opens unless given it: a scan of the import path that costs milliseconds, so a burst
that filled a pool (forty api threads at once, a worker's sixty-four) paid seconds of CPU
for it. The version is read once here and handed to every client.
"""

from __future__ import annotations

import redis
from redis.driver_info import DriverInfo

DRIVER_INFO = DriverInfo(lib_version=redis.__version__)
