"""hung: `time.sleep` forever."""

import time

from _corpus import started

started()
time.sleep(10**9)
