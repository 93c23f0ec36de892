"""Episode data: benchmark-layout readers, converters (PhysioNet 2012, eICU demo), synthetic data.

The public entry points are `load_split` (one split as arrays, cached) and `write_synthetic`.
"""

from scehr.training.data.splits import SplitArrays, load_split
from scehr.training.data.synthetic import write_synthetic

__all__ = ["SplitArrays", "load_split", "write_synthetic"]
