# The tests here import the oracle beside them (_jax_oracle.py) under any pytest import mode.
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

# test_sharding.py needs several host devices; XLA reads this when jax first starts a backend,
# which no test module here does at import (te_jax registers its FFI targets without one).
HOST_DEVICES = 4
_flag = f"--xla_force_host_platform_device_count={HOST_DEVICES}"
if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + _flag).strip()
