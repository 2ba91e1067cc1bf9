# The tests here import the oracle beside them (_jax_oracle.py) under any pytest import mode.
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
