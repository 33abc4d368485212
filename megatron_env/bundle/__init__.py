"""Offline bundles: made where the network is, checked and used where it is not."""
