"""A policy on a device: what the actors do, below them. Numpy in, numpy out; the forward, the
episodes, the per-dtype policy cache, layer capture, injected faults and the timing loops."""
