"""Datasets: pretraining samples from `.bin/.idx` corpora, whole-word masking, weighted corpus mixtures
and the identity of training data (over data_tools)."""
