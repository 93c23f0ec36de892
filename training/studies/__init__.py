"""Research studies built on the training library: grids, imbalance and method comparisons,
multi-seed studies with their reports, head-to-head tables, classical baselines and embedding
quality. The library (training/) never imports from here; a study may use all of the library.
"""
