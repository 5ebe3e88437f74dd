"""Fuzzing stagec: random models on random hardware against PyTorch eager, and damaged program files.

`experiments/fuzz_campaign.py` runs a campaign and writes its table; a seeded quick subset runs in the
test suite.
"""
